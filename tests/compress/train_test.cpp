// Each compress reducer trains the mlp on Fashion-MNIST through the real CLI
// (`distopt train`, 2 ranks x 2 epochs, batch 256 per rank, SGD lr 0.1
// momentum 0.9): the accuracies the issue asks for, with `mean` run in the
// same test as the baseline, and bytes_sent really compressed.
#include <doctest/doctest.h>

#include <cstdlib>
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

using distopt::test::env_path;
using distopt::test::run_command;
using nlohmann::json;

struct Outcome {
  double accuracy = -1;
  double bytes = -1;  // rank 0, whole run
};

Outcome train(const std::string& dir, const std::string& name, const std::string& reducer,
              double lr = 0.1, double momentum = 0.9) {
  const std::string plugins = env_path("DISTOPT_PLUGIN_DIR"), cli = env_path("DISTOPT_CLI");
  REQUIRE_MESSAGE(!plugins.empty(), "DISTOPT_PLUGIN_DIR is not set (run through ctest)");
  REQUIRE_MESSAGE(!cli.empty(), "DISTOPT_CLI is not set (run through ctest)");
  const std::string job = dir + "/" + name + ".yaml", metrics = dir + "/" + name + ".jsonl";
  std::ofstream(job) << "plugins: {paths: [" << plugins << "]}\n"
                     << "world: {size: 2, timeout_s: 60}\n"
                     << "communicator: {name: tcp}\n"
                     << "reducer: " << reducer << "\n"
                     << "algorithm: {name: allreduce}\n"
                     << "optimizer: {name: sgd, lr: " << lr << ", momentum: " << momentum << "}\n"
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
  // The lossy reducers carry the momentum themselves (DGC momentum
  // correction; the optimizer runs without): applied after compression, the
  // optimizer's momentum made topk swing between 75% and 83% with the seed
  // and the BLAS kernels (BENCHMARKS.md "Compression robustness" has the study).
  // Sign methods take a smaller step than SGD (Bernstein et al. tune lr
  // separately for signSGD).
  Outcome sign = train(
      dir, "signsgd", "{name: signsgd, options: {error_feedback: true, momentum: 0.9}}", 0.02, 0.0);
  Outcome topk =
      train(dir, "topk",
            "{name: topk, options: {ratio: 0.01, error_feedback: true, momentum: 0.9}}", 0.1, 0.0);
  // Random-k has no momentum that works (BENCHMARKS.md): every element waits
  // ~1/ratio steps, and any momentum on top of that staleness diverges.
  Outcome randomk = train(
      dir, "randomk", "{name: randomk, options: {ratio: 0.01, error_feedback: true}}", 0.1, 0.0);
  distopt::test::remove_tree(dir);

  // Floors: the targets; over 3 seeds x 3 BLAS kernel sets the
  // lowest seen was mean 85.9, signsgd 83.9, topk 85.6; randomk 80.9 (the
  // machine's kernels and Haswell's alike, 2026-11), floor 2.9 points under.
  CHECK(mean.accuracy >= 0.83);
  CHECK(std::abs(fp16.accuracy - mean.accuracy) <= 0.005);
  CHECK(std::abs(bf16.accuracy - mean.accuracy) <= 0.005);
  CHECK(sign.accuracy >= 0.81);
  CHECK(topk.accuracy >= 0.82);
  CHECK(randomk.accuracy >= 0.78);
  // Bytes on the wire: 16-bit casts send exactly half of mean; signsgd about
  // 1/32 (plus a float per tensor); topk 1% (at least min_k 256 per tensor)
  // of pairs of 8 bytes over an allgather (2 ranks: 6104 pairs a step, 1/44
  // of mean's ring allreduce of 535818 floats); randomk the same elements'
  // values only, in a ring allreduce (1/88).
  CHECK(fp16.bytes * 2 == mean.bytes);
  CHECK(bf16.bytes * 2 == mean.bytes);
  CHECK(sign.bytes < mean.bytes / 30);
  CHECK(topk.bytes < mean.bytes / 40);
  CHECK(randomk.bytes < mean.bytes / 80);
}

TEST_CASE("a reducer that applies momentum itself refuses an optimizer with momentum too") {
  const std::string plugins = env_path("DISTOPT_PLUGIN_DIR"), cli = env_path("DISTOPT_CLI");
  REQUIRE(!cli.empty());
  const std::string dir = distopt::test::make_temp_dir("distopt_compress_check");
  const std::string job = dir + "/double-momentum.yaml";
  std::ofstream(job) << "plugins: {paths: [" << plugins << "]}\n"
                     << "reducer: {name: topk, options: {momentum: 0.9}}\n"
                     << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n";
  auto r = run_command({cli, "check", job}, {}, std::chrono::seconds(60));
  distopt::test::remove_tree(dir);
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("double-momentum.yaml") != std::string::npos);
  CHECK(r.output.find("reducer.options.momentum") != std::string::npos);
  CHECK(r.output.find("optimizer.momentum: 0") != std::string::npos);
  CHECK(r.output.find("optimizer.momentum is 0.9:") != std::string::npos);  // as written
}
