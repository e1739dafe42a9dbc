// `distopt check` / `distopt train` with the decentralized algorithm:
// refusals at check time naming file:line, the quickstart MLP on 4 ranks x 2
// epochs (the mean model is evaluated), and a rank killed during the
// neighbour exchange named by the survivors. Torch-free.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
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
                      int epochs = 2) {
  distopt::test::JobYaml j = distopt::test::quickstart_job(world);
  j.algorithm = algorithm;
  j.reducer = reducer;
  j.train->epochs = epochs;
  return distopt::test::write_job(dir + "/" + name, j);
}

}  // namespace

TEST_CASE("distopt check refuses bad decentralized jobs, naming file:line") {
  const std::string dir = distopt::test::make_temp_dir("distopt_dcheck");
  struct Case {
    std::string algorithm, reducer, where, why;
    int world;
  };
  const Case cases[] = {
      {"{name: decentralized, options: {topology: shift_one}}", "{name: mean}",
       ":3:54: algorithm.options.topology", "even world size", 3},
      {"{name: decentralized, options: {topology: neighbors, neighbors: '0:1; 1:2; 2:0'}}",
       "{name: mean}", ":3:76: algorithm.options.neighbors",
       "rank 0 lists 1 but rank 1 does not list 0", 3},
      {"{name: decentralized}", "{name: topk, options: {ratio: 0.1}}", ":4:", "would not apply", 2},
      {"{name: decentralized, options: {topology: shift_one, low_precision: true}}", "{name: mean}",
       ":3:54: algorithm.options.topology", "shift_one's peer changes every round", 4},
      {"{name: decentralized, options: {topology: complete, low_precision: true}}", "{name: mean}",
       ":3:54: algorithm.options.topology", "low_precision with complete", 4},
      {"{name: decentralized, options: {topology: ring, neighbors: '0:1; 1:0'}}", "{name: mean}",
       ":3:", "neighbors is only read with topology: neighbors", 2},
      // The reducer line carries one more section: line 5.
      {"{name: decentralized}", "{name: mean}\nprecision: {dtype: bf16}",
       ":5:", "does not support mixed precision", 2},
  };
  int i = 0;
  for (const Case& c : cases) {
    distopt::test::check_refuses(
        write_job(dir, "bad" + std::to_string(i++) + ".yaml", c.world, c.algorithm, c.reducer),
        c.where, {c.why});
  }
  for (const char* good : {"{name: decentralized, options: {topology: shift_one}}",
                           "{name: decentralized, options: {low_precision: true}}"})
    distopt::test::check_accepts(write_job(dir, "ok.yaml", 4, good));
  distopt::test::remove_tree(dir);
}

TEST_CASE("distopt train: 4 ranks x 2 epochs, ring, shift_one and low_precision learn the MLP") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_dtrain_cli");
  for (const char* options : {"topology: ring", "topology: shift_one", "low_precision: true"}) {
    CAPTURE(options);
    const std::string job = write_job(
        dir, "job.yaml", 4, std::string("{name: decentralized, options: {") + options + "}}");
    const std::string metrics = dir + "/metrics.jsonl";
    std::remove(metrics.c_str());
    auto summary = distopt::test::train_consensus_summary(job, metrics);
    MESSAGE(std::string(options) << ": test accuracy "
                                 << summary["final_test_accuracy"].get<double>());
    CHECK(summary["final_test_accuracy"].get<double>() >= 0.84);
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("a rank killed during the neighbour exchange is named, and the job fails") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_dkill");
  for (const char* algorithm :
       {"{name: decentralized}", "{name: decentralized, options: {link_schedule: one_at_a_time}}",
        "{name: decentralized, options: {low_precision: true}}",
        "{name: decentralized, options: {low_precision: true, link_schedule: one_at_a_time}}"}) {
    CAPTURE(algorithm);
    distopt::test::check_killed_rank_named(write_job(dir, "job.yaml", 2, algorithm));
  }
  distopt::test::remove_tree(dir);
}
