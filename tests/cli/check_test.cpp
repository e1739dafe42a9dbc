// `distopt check` refuses what `distopt train` refuses and says what the
// job will run.
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.hpp"

using distopt::test::env_path;
using distopt::test::ProcResult;
using distopt::test::run_command;
using distopt::test::cli::cli;
using distopt::test::cli::TempDir;

namespace {

struct Checked {
  int code;
  std::string output;
};

Checked check(const TempDir& t, const std::string& name, const std::string& body) {
  const std::string path = t.file(name);
  std::ofstream(path) << "plugins: {paths: ['" << env_path("DISTOPT_PLUGIN_DIR") << "']}\n" << body;
  ProcResult r = run_command({cli(), "check", path}, {}, std::chrono::seconds(60));
  return {r.exit_code, r.output};
}

bool has(const std::string& s, const std::string& needle) {
  if (s.find(needle) != std::string::npos) return true;
  MESSAGE("missing '" << needle << "' in: " << s);
  return false;
}

}  // namespace

TEST_CASE("check refuses fp16 for a model on the CPU, as train does") {
  TempDir t;
  Checked c = check(t, "fp16.yaml", "precision: {dtype: fp16}\ntrain: {model: mlp, device: cpu}\n");
  CHECK(c.code == 1);
  CHECK(has(c.output, "fp16.yaml"));
  CHECK(has(c.output, "precision.dtype: fp16 needs a GPU"));
  // Without a train: section the file may be an embedding program's: no opinion on the device.
  Checked e = check(t, "embed.yaml", "precision: {dtype: bf16}\n");
  CHECK(e.code == 0);
}

TEST_CASE("check refuses a data_dir without Fashion-MNIST") {
  TempDir t;
  Checked c = check(t, "nodata.yaml", "train: {data_dir: " + t.file("nowhere") + "}\n");
  CHECK(c.code == 1);
  CHECK(has(c.output, "train.data_dir"));
  CHECK(has(c.output, "train-images-idx3-ubyte"));
}

TEST_CASE("check summarises a schedule and warns about a phase that never runs") {
  TempDir t;
  Checked c = check(t, "sched.yaml",
                    "schedule:\n"
                    "  - until_epoch: 5\n"
                    "    algorithm: {name: allreduce}\n"
                    "  - algorithm: {name: zero}\n"
                    "train: {epochs: 2, dataset: synthetic}\n");
  CHECK(c.code == 0);
  CHECK(has(c.output, "algorithm allreduce until epoch 5, then zero"));
  CHECK(has(c.output, "schedule[1] and later phases never run"));
}

TEST_CASE("did you mean: a key's prefix and a near component name") {
  TempDir t;
  Checked k = check(t, "cap.yaml", "reducer: {name: mean, options: {bucket_cap: 4}}\n");
  CHECK(k.code == 1);
  CHECK(has(k.output, "did you mean 'bucket_cap_mb'?"));
  Checked n = check(t, "zer0.yaml", "algorithm: {name: zer0}\n");
  CHECK(n.code == 1);
  CHECK(has(n.output, "did you mean 'zero'?"));
}
