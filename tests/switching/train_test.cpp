// `distopt check` / `distopt train` with a `schedule:`: a bad phase refused
// naming the file, line and phase; the quickstart MLP on 2 ranks, allreduce
// for epoch 1 then decentralized, with the epoch metrics naming the
// algorithm of each epoch and a resume from the phase-2 checkpoint landing
// in phase 2. Torch-free.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "job_yaml.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"
#include "train_metrics.hpp"

using distopt::test::env_path;
using distopt::test::run_command;

namespace {

std::string write_job(const std::string& dir, const std::string& name, int world,
                      const std::string& schedule) {
  distopt::test::JobYaml j = distopt::test::quickstart_job(world);
  j.extra = "schedule:\n" + schedule;
  return distopt::test::write_job(dir + "/" + name, j);
}

std::vector<nlohmann::json> epoch_events(const std::string& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && nlohmann::json::parse(line)["event"] == "epoch")
      out.push_back(nlohmann::json::parse(line));
  return out;
}

const char* kTwoPhases =
    "  - {until_epoch: 1, algorithm: {name: allreduce}}\n"
    "  - {algorithm: {name: decentralized, options: {topology: ring}}}\n";

}  // namespace

TEST_CASE("distopt check refuses a phase its component refuses, naming file:line and phase") {
  const std::string cli = env_path("DISTOPT_CLI");
  const std::string dir = distopt::test::make_temp_dir("distopt_scheck");
  const std::string bad =
      write_job(dir, "bad.yaml", 3,
                "  - {until_step: 10}\n"
                "  - {algorithm: {name: decentralized, options: {topology: shift_one}}}\n");
  auto r = run_command({cli, "check", bad}, {}, std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(bad + ":7:") != std::string::npos);
  CHECK(r.output.find("schedule[1]") != std::string::npos);
  auto ok = run_command({cli, "check", write_job(dir, "ok.yaml", 2, kTwoPhases)}, {},
                        std::chrono::seconds(60));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  distopt::test::remove_tree(dir);
}

TEST_CASE("distopt train: allreduce for epoch 1, then decentralized; a resume lands in phase 2") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string cli = env_path("DISTOPT_CLI");
  const std::string dir = distopt::test::make_temp_dir("distopt_strain");
  const std::string job = write_job(dir, "job.yaml", 2, kTwoPhases);
  const std::string metrics = dir + "/metrics.jsonl", ckpt = dir + "/ckpt";
  auto r = run_command({cli, "train", job, "--metrics", metrics, "--checkpoint", ckpt}, {},
                       std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("schedule phase 1") != std::string::npos);
  const auto epochs = epoch_events(metrics);
  REQUIRE(epochs.size() == 2);
  CHECK(epochs[0]["algorithm"] == "allreduce");
  CHECK(epochs[0]["schedule_phase"] == 0);
  CHECK(epochs[1]["algorithm"] == "decentralized");
  CHECK(epochs[1]["schedule_phase"] == 1);
  CHECK(epochs[1].contains("consensus_distance"));
  const auto summary = distopt::test::metrics_summary(metrics);
  REQUIRE(summary.is_object());
  MESSAGE("test accuracy " << summary["final_test_accuracy"].get<double>());
  CHECK(summary["final_test_accuracy"].get<double>() >= 0.83);

  // The last checkpoint was saved in phase 1 (decentralized): a resume with
  // one more epoch continues there.
  const std::string longer = write_job(dir, "longer.yaml", 2, kTwoPhases);
  {
    std::ifstream in(longer);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("epochs: 2"), 9, "epochs: 3");
    std::ofstream(longer) << text;
  }
  const std::string metrics2 = dir + "/metrics2.jsonl";
  auto r2 =
      run_command({cli, "train", longer, "--metrics", metrics2, "--checkpoint", ckpt, "--resume"},
                  {}, std::chrono::seconds(300));
  INFO(r2.output);
  REQUIRE(r2.exit_code == 0);
  const auto resumed = epoch_events(metrics2);
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0]["epoch"] == 3);
  CHECK(resumed[0]["algorithm"] == "decentralized");
  CHECK(resumed[0]["schedule_phase"] == 1);
  distopt::test::remove_tree(dir);
}
