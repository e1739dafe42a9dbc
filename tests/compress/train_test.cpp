// Each compress reducer trains the mlp on Fashion-MNIST through the real CLI
// (`distopt train`, 2 ranks x 2 epochs, batch 256 per rank, SGD lr 0.1
// momentum 0.9): the accuracies the issue asks for, with `mean` run in the
// same test as the baseline, and bytes_sent really compressed.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "multiproc.hpp"
#include "result_files.hpp"
#include "train_metrics.hpp"

namespace {

namespace fs = std::filesystem;
using distopt::test::env_path;
using distopt::test::run_command;
using nlohmann::json;

struct Outcome {
  double accuracy = -1;
  double bytes = -1;  // rank 0, whole run
};

Outcome train(const std::string& dir, const std::string& name, const std::string& reducer,
              double lr = 0.1) {
  const std::string plugins = env_path("DISTOPT_PLUGIN_DIR"), cli = env_path("DISTOPT_CLI");
  REQUIRE_MESSAGE(!plugins.empty(), "DISTOPT_PLUGIN_DIR is not set (run through ctest)");
  REQUIRE_MESSAGE(!cli.empty(), "DISTOPT_CLI is not set (run through ctest)");
  const std::string job = dir + "/" + name + ".yaml", metrics = dir + "/" + name + ".jsonl";
  std::ofstream(job) << "plugins: {paths: [" << plugins << "]}\n"
                     << "world: {size: 2, timeout_s: 60}\n"
                     << "communicator: {name: tcp}\n"
                     << "reducer: " << reducer << "\n"
                     << "algorithm: {name: allreduce}\n"
                     << "optimizer: {name: sgd, lr: " << lr << ", momentum: 0.9}\n"
                     << "train: {model: mlp, epochs: 2, batch_size: 256, seed: 0, threads: 1}\n";
  auto r = run_command({cli, "train", job, "--metrics", metrics}, {}, std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  Outcome o;
  const json summary = distopt::test::metrics_summary(metrics);
  if (summary.is_object()) {
    o.accuracy = summary["final_test_accuracy"].get<double>();
    o.bytes = summary["bytes_sent_per_rank"][0].get<double>();
  }
  MESSAGE(name << ": test accuracy " << o.accuracy << ", bytes sent by rank 0 " << o.bytes);
  REQUIRE(o.accuracy >= 0);
  return o;
}

}  // namespace

TEST_CASE("compress reducers train the mlp on Fashion-MNIST (2 ranks x 2 epochs)") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_compress_train");
  Outcome mean = train(dir, "mean", "{name: mean}");
  Outcome fp16 = train(dir, "fp16", "{name: fp16}");
  Outcome bf16 = train(dir, "bf16", "{name: bf16}");
  // Sign methods take a smaller step than SGD (Bernstein et al. tune lr
  // separately for signSGD): at lr 0.1 with momentum 0.9 the +-scale update
  // on every coordinate diverges here; lr 0.02 gives ~82%.
  Outcome sign = train(dir, "signsgd", "{name: signsgd, options: {error_feedback: true}}", 0.02);
  Outcome topk = train(dir, "topk", "{name: topk, options: {ratio: 0.01, error_feedback: true}}");
  fs::remove_all(dir);

  CHECK(mean.accuracy >= 0.80);
  CHECK(std::abs(fp16.accuracy - mean.accuracy) <= 0.005);
  CHECK(std::abs(bf16.accuracy - mean.accuracy) <= 0.005);
  CHECK(sign.accuracy >= 0.80);
  CHECK(topk.accuracy >= 0.80);
  // Bytes on the wire: 16-bit casts send exactly half of mean; signsgd about
  // 1/32 (plus a float per tensor); topk 1% of pairs of 8 bytes over an
  // allgather (2 ranks: (W-1) x 8 x k = 2% of 4-byte elements, vs mean's 1x).
  CHECK(fp16.bytes * 2 == mean.bytes);
  CHECK(bf16.bytes * 2 == mean.bytes);
  CHECK(sign.bytes < mean.bytes / 30);
  CHECK(topk.bytes < mean.bytes / 40);
}
