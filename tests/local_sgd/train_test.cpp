// `distopt check` / `distopt train` with the local_sgd algorithm: refusals
// at check time naming file:line:column, the quickstart MLP on 4 ranks x 2
// epochs with period 4 (the mean model is evaluated; only every 4th step
// sends), and a rank killed during the local phase named by the survivor at
// the next average. Torch-free.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_checks.hpp"
#include "job_yaml.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"
#include "train_metrics.hpp"

namespace {

std::string write_job(const std::string& dir, const std::string& name, int world,
                      const std::string& algorithm, const std::string& reducer = "{name: mean}",
                      const std::string& extra = "") {
  distopt::test::JobYaml j = distopt::test::quickstart_job(world);
  j.algorithm = algorithm;
  j.reducer = reducer;
  j.extra = extra;
  return distopt::test::write_job(dir + "/" + name, j);
}

}  // namespace

TEST_CASE("distopt check refuses bad local_sgd jobs, naming file:line:column") {
  const std::string dir = distopt::test::make_temp_dir("distopt_lsgd_check");
  struct Case {
    std::string algorithm, reducer, extra, where, why;
  };
  const Case cases[] = {
      {"{name: local_sgd, options: {period: 0}}", "{name: mean}", "",
       ":3:48: algorithm.options.period", "value 0 is out of range [1, 1000000]"},
      {"{name: local_sgd, options: {warmup_steps: -1}}", "{name: mean}", "",
       ":3:54: algorithm.options.warmup_steps", "out of range [0, inf)"},
      {"{name: local_sgd}", "{name: topk, options: {ratio: 0.1}}", "", ":4:17: reducer.name",
       "reducer 'topk' would never run"},
      {"{name: local_sgd, options: {warmup_steps: 10}}", "{name: mean}",
       "precision: {dtype: bf16}\n", ":7:20: precision.dtype",
       "local_sgd does not support mixed precision"},
  };
  int i = 0;
  for (const Case& c : cases) {
    distopt::test::check_refuses(
        write_job(dir, "bad" + std::to_string(i++) + ".yaml", 4, c.algorithm, c.reducer, c.extra),
        c.where, {c.why});
  }
  // A compressing reducer is fine when the warm-up uses it.
  distopt::test::check_accepts(write_job(dir, "ok.yaml", 4,
                                         "{name: local_sgd, options: {warmup_steps: 10}}",
                                         "{name: topk, options: {ratio: 0.1}}"));
  distopt::test::remove_tree(dir);
}

TEST_CASE("distopt train: 4 ranks x 2 epochs, local SGD with period 4 learns the MLP") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_lsgd_train");
  const std::string job = write_job(dir, "job.yaml", 4, "{name: local_sgd, options: {period: 4}}");
  const std::string metrics = dir + "/metrics.jsonl";
  auto summary = distopt::test::train_consensus_summary(job, metrics);
  const double accuracy = summary["final_test_accuracy"].get<double>();
  MESSAGE("local_sgd period 4: test accuracy " << accuracy);
  // Measured 85.89% (seeds 1, 2: 86.19%, 86.10%; Haswell kernels 85.93%;
  // allreduce on this job 85.88%). The issue asks >= 85%; the floor keeps
  // 2 points below the lowest measurement.
  CHECK(accuracy >= 0.838);
  // Warm-up 0: only the averages after every 4th step send, each one ring
  // allreduce of the buckets, what a plain allreduce sends per step.
  const auto steps = summary["steps"].get<uint64_t>();
  const auto plain = summary["bytes_sent_plain_allreduce_per_rank"][0].get<uint64_t>();
  REQUIRE(steps > 0);
  REQUIRE(plain % steps == 0);
  for (const auto& b : summary["bytes_sent_per_rank"])
    CHECK(b.get<uint64_t>() == plain / steps * (steps / 4));
  distopt::test::remove_tree(dir);
}

TEST_CASE("a rank killed during the local steps is named at the next average, and the job fails") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_lsgd_kill");
  // Rank 1 dies before step 5; rank 0 takes local steps 5 and 6 alone and
  // fails in the average after step 7.
  distopt::test::check_killed_rank_named(
      write_job(dir, "job.yaml", 2, "{name: local_sgd, options: {period: 4}}"));
  distopt::test::remove_tree(dir);
}
