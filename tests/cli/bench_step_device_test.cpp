// `distopt bench step --device`: the torch fused baseline row, the hybrid
// rows, the floor measured like the steps with its spread, and the refusal
// of cuda where libtorch has none (on a GPU machine: the CUDA table itself).
#include <doctest/doctest.h>

#include <iterator>
#include <regex>
#include <string>

#include "multiproc.hpp"

using distopt::test::env_path;
using distopt::test::ProcResult;
using distopt::test::run_command;

namespace {

ProcResult bench(std::vector<std::string> args) {
  std::vector<std::string> argv = {env_path("DISTOPT_CLI"), "bench", "step", "-P",
                                   env_path("DISTOPT_PLUGIN_DIR")};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, {}, std::chrono::seconds(240));
}

int count(const std::string& text, const std::string& re) {
  std::regex r(re);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), r), std::sregex_iterator()));
}

// A timed row: name, ms, GB/s, x floor, speedup, min..max.
const char* kTimed = R"(\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\.\.[0-9.]+)";

}  // namespace

TEST_CASE("bench step on cpu: unfused, torch fused, fused and hybrid rows with their spread") {
  ProcResult r =
      bench({"--device", "cpu", "--total", "1", "--tensors", "16", "--iters", "3", "--hybrid"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(count(r.output, R"(bench step: adam on cpu, 16 tensors)") == 1);
  // The copy is timed like the steps: median with min..max over both passes.
  CHECK(count(r.output,
              R"(copy bandwidth: [0-9.]+ GB/s median \([0-9.]+\.\.[0-9.]+\) over 6 copies)") == 1);
  CHECK(count(r.output, std::string(R"(\nunfused)") + kTimed) == 1);
  CHECK(count(r.output, std::string(R"(\nfused)") + kTimed) == 1);
  // torch's fused Adam: timed, or its absence said (libtorch < 2.4 has no CPU kernel).
  CHECK(count(r.output, std::string(R"(\ntorch fused()") + kTimed +
                            R"(|\s+-\s+unsupported by this libtorch))") == 1);
  // The same kernel over the fused plugin's layout: timed, or absent the same way.
  CHECK(count(r.output, std::string(R"(\ntorch fused lay()") + kTimed +
                            R"(|\s+-\s+unsupported by this libtorch))") == 1);
  CHECK(count(r.output, std::string(R"(\nhybrid f=(0|0\.5|1) (ovl|seq))") + kTimed) == 6);
}

TEST_CASE("bench step --device: cuda runs or is refused with the reason, others are refused") {
  ProcResult r = bench({"--device", "cuda", "--total", "1", "--tensors", "8", "--iters", "2"});
  INFO(r.output);
  if (r.output.find("torch::cuda::is_available() is false") != std::string::npos) {
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("--device cuda needs a libtorch built with CUDA") != std::string::npos);
  } else {  // a GPU machine: the table on the device
    REQUIRE(r.exit_code == 0);
    CHECK(count(r.output, R"(bench step: adam on cuda)") == 1);
    CHECK(count(r.output, std::string(R"(\nunfused)") + kTimed) == 1);
    CHECK(count(r.output, std::string(R"(\ntorch fused)") + kTimed) == 1);
    CHECK(count(r.output, std::string(R"(\ntorch fused lay)") + kTimed) == 1);
  }
  ProcResult bad = bench({"--device", "tpu"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("--device must be cpu or cuda, got 'tpu'") != std::string::npos);
}

TEST_CASE("bench step --align-bytes: one more fused row per alignment; a bad one is refused") {
  ProcResult r =
      bench({"--total", "1", "--tensors", "16", "--iters", "2", "--align-bytes", "16", "64"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(count(r.output, std::string(R"(\nfused)") + kTimed) == 1);
  CHECK(count(r.output, std::string(R"(\nfused a=16)") + kTimed) == 1);
  CHECK(count(r.output, std::string(R"(\nfused a=64)") + kTimed) == 1);
  ProcResult bad = bench({"--total", "1", "--align-bytes", "0"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("--align-bytes must be >= 1, got 0") != std::string::npos);
}
