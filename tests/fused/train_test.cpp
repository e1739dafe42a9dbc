// `distopt train` (the real CLI, 2 ranks on loopback, Fashion-MNIST) with the
// fused algorithm + Adam: it learns, and ends with the same test accuracy,
// test loss and train loss (within 1e-4) as the same job with allreduce +
// Adam, i.e. the fused step is the unfused inner optimizer's update, with
// either update code (kernels host and torch).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "multiproc.hpp"
#include "result_files.hpp"
#include "train_metrics.hpp"

using distopt::test::env_path;
using distopt::test::run_command;
using nlohmann::json;

namespace {

const char* const kData = distopt::test::kFashionMnistDir;

// Runs the job with `algorithm` and returns its summary metrics line.
json train(const std::string& dir, const std::string& algorithm) {
  const std::string cli = env_path("DISTOPT_CLI"), plugins = env_path("DISTOPT_PLUGIN_DIR");
  REQUIRE_MESSAGE(!cli.empty(), "DISTOPT_CLI is not set (run through ctest)");
  const std::string job = dir + "/job.yaml", metrics = dir + "/metrics.jsonl";
  std::ofstream(job) << "plugins: {paths: [" << plugins << "]}\n"
                     << "world: {size: 2, timeout_s: 60}\n"
                     << "communicator: {name: tcp}\n"
                     << "reducer: {name: mean}\n"
                     << "algorithm: " << algorithm << "\n"
                     << "optimizer: {name: adam, lr: 1.0e-3}\n"
                     << "train: {model: mlp, epochs: 1, batch_size: 64, max_steps: 30, seed: 0, "
                        "threads: 1}\n";
  std::remove(metrics.c_str());
  auto r = run_command({cli, "train", job, "--data", kData, "--metrics", metrics}, {},
                       std::chrono::seconds(200));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  const json summary = distopt::test::metrics_summary(metrics);
  REQUIRE(summary.is_object());
  CHECK(summary["steps"].get<int>() == 30);
  return summary;
}

}  // namespace

TEST_CASE("distopt train: fused Adam, 2 ranks x 30 steps, learns and equals allreduce + Adam") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_fused_train");
  const json base = train(dir, "{name: allreduce}");
  CHECK(base["algorithm"] == "allreduce");
  // do_flatten: one kernel per group over the flat state; off: one per
  // contiguous run of parameters; kernels torch: the device path (libtorch
  // multi-tensor ops) on the CPU. All must be the unfused update.
  for (const char* options :
       {"{do_flatten: true, check_flatten: true}", "{do_flatten: false}", "{kernels: torch}"}) {
    CAPTURE(options);
    const json fused = train(dir, std::string("{name: fused, options: ") + options + "}");
    CHECK(fused["algorithm"] == "fused");
    CHECK(fused["final_test_accuracy"].get<double>() > 0.6);  // chance: 0.1
    for (const char* key : {"final_test_accuracy", "final_test_loss", "final_train_loss"}) {
      CAPTURE(key);
      CHECK(std::fabs(fused[key].get<double>() - base[key].get<double>()) <= 1e-4);
    }
  }
  distopt::test::remove_tree(dir);
}
