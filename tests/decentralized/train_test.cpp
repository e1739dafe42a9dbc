// `distopt check` / `distopt train` with the decentralized algorithm:
// refusals at check time naming file:line, the quickstart MLP on 4 ranks x 2
// epochs (the mean model is evaluated), and a rank killed during the
// neighbour exchange named by the survivors. Torch-free.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "multiproc.hpp"
#include "result_files.hpp"
#include "train_metrics.hpp"

using distopt::test::env_path;
using distopt::test::run_command;

namespace {

std::string write_job(const std::string& dir, const std::string& name, int world,
                      const std::string& algorithm, const std::string& reducer = "{name: mean}",
                      int epochs = 2) {
  const std::string job = dir + "/" + name;
  std::ofstream(job) << "plugins: {paths: [" << env_path("DISTOPT_PLUGIN_DIR") << "]}\n"
                     << "world: {size: " << world << ", timeout_s: 60}\n"
                     << "algorithm: " << algorithm << "\n"
                     << "reducer: " << reducer << "\n"
                     << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
                     << "train: {model: mlp, epochs: " << epochs
                     << ", batch_size: 128, seed: 0, threads: 1}\n";
  return job;
}

}  // namespace

TEST_CASE("distopt check refuses bad decentralized jobs, naming file:line") {
  const std::string cli = env_path("DISTOPT_CLI");
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
    const std::string job =
        write_job(dir, "bad" + std::to_string(i++) + ".yaml", c.world, c.algorithm, c.reducer);
    auto r = run_command({cli, "check", job}, {}, std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(job + c.where) != std::string::npos);
    CHECK(r.output.find(c.why) != std::string::npos);
  }
  for (const char* good : {"{name: decentralized, options: {topology: shift_one}}",
                           "{name: decentralized, options: {low_precision: true}}"}) {
    auto ok = run_command({cli, "check", write_job(dir, "ok.yaml", 4, good)}, {},
                          std::chrono::seconds(60));
    INFO(ok.output);
    CHECK(ok.exit_code == 0);
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("distopt train: 4 ranks x 2 epochs, ring, shift_one and low_precision learn the MLP") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string cli = env_path("DISTOPT_CLI");
  const std::string dir = distopt::test::make_temp_dir("distopt_dtrain_cli");
  for (const char* options : {"topology: ring", "topology: shift_one", "low_precision: true"}) {
    CAPTURE(options);
    const std::string job = write_job(
        dir, "job.yaml", 4, std::string("{name: decentralized, options: {") + options + "}}");
    const std::string metrics = dir + "/metrics.jsonl";
    std::remove(metrics.c_str());
    auto r = run_command({cli, "train", job, "--metrics", metrics}, {}, std::chrono::seconds(300));
    INFO(r.output);
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("consensus distance") != std::string::npos);
    const auto summary = distopt::test::metrics_summary(metrics);
    REQUIRE(summary.is_object());
    MESSAGE(std::string(options) << ": test accuracy "
                                 << summary["final_test_accuracy"].get<double>());
    CHECK(summary["final_test_accuracy"].get<double>() >= 0.84);
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("a rank killed during the neighbour exchange is named, and the job fails") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string cli = env_path("DISTOPT_CLI");
  const std::string dir = distopt::test::make_temp_dir("distopt_dkill");
  for (const char* algorithm :
       {"{name: decentralized}", "{name: decentralized, options: {low_precision: true}}"}) {
    CAPTURE(algorithm);
    const std::string job = write_job(dir, "job.yaml", 2, algorithm);
    auto r = run_command({cli, "train", job}, {"DISTOPT_FAULT_INJECT=exit:1:5"},
                         std::chrono::seconds(120));
    INFO(r.output);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("rank 1 failed (exit code 137)") != std::string::npos);
    CHECK(std::regex_search(r.output, std::regex(R"(\[rank 0\] .*error.*rank 1)")));
  }
  distopt::test::remove_tree(dir);
}
