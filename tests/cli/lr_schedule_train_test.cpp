// `distopt train` with optimizer.lr_schedule (total_steps filled in from the
// epochs) and optimizer.grad_clip on 2 ranks: the log line and the JSON
// epoch events report lr and grad_norm, the lr follows the schedule over the
// run's length; `distopt check` refuses what train refuses.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "multiproc.hpp"
#include "result_files.hpp"

using distopt::test::env_path;
using distopt::test::ProcResult;
using distopt::test::run_command;
using nlohmann::json;

TEST_CASE("distopt train: lr_schedule without total_steps and grad_clip, reported") {
  const std::string cli = env_path("DISTOPT_CLI"), plugins = env_path("DISTOPT_PLUGIN_DIR");
  REQUIRE_MESSAGE(!cli.empty(), "DISTOPT_CLI is not set (run through ctest)");
  const std::string dir = distopt::test::make_temp_dir("distopt_lrsched_train");
  std::ostringstream y;
  // 2 ranks x 32 images: 8 steps per epoch, 2 epochs = 16 steps.
  y << "plugins: {paths: [" << plugins << "]}\n"
    << "world: {size: 2, timeout_s: 60}\n"
    << "communicator: {name: tcp}\nreducer: {name: mean, options: {bucket_cap_mb: 0.01}}\n"
    << "algorithm: {name: zero, options: {stage: 2}}\n"
    << "optimizer:\n  name: sgd\n  lr: 0.1\n  grad_clip: 0.05\n"
    << "  lr_schedule: {kind: linear, warmup_steps: 4, end_factor: 0}\n"
    << "train: {model: mlp, dataset: synthetic, epochs: 2, batch_size: 32, seed: 1,\n"
    << "        log_every: 4, threads: 1,\n"
    << "        synthetic: {train_samples: 512, test_samples: 64, channels: 1, height: 8,\n"
    << "                    width: 8, classes: 4, noise: 0.5}}\n";
  std::ofstream(dir + "/job.yaml") << y.str();
  ProcResult r = run_command({cli, "train", dir + "/job.yaml", "--metrics", dir + "/m.jsonl"}, {},
                             std::chrono::seconds(240));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  // step 4 of epoch 1 logs the lr of step 4 (0-based): the warm-up is over
  CHECK(r.output.find("step 4/8 loss ") != std::string::npos);
  CHECK(r.output.find(" lr 0.1 grad_norm ") != std::string::npos);
  std::vector<json> m;
  std::ifstream f(dir + "/m.jsonl");
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && json::parse(line)["event"] == "epoch") m.push_back(json::parse(line));
  REQUIRE(m.size() == 2);
  // total_steps = 16: after epoch 1 (8 steps) the factor is 1 - 4/12
  CHECK(m[0]["lr"].get<double>() == doctest::Approx(0.1 * (1 - 4.0 / 12)));
  CHECK(m[1]["lr"].get<double>() == doctest::Approx(0.0));
  CHECK(m[0]["grad_norm"].get<double>() > 0.05);  // above the clip: it clipped
  distopt::test::remove_tree(dir);
}

TEST_CASE("distopt check refuses a bad lr_schedule at its line, as train does") {
  const std::string cli = env_path("DISTOPT_CLI"), plugins = env_path("DISTOPT_PLUGIN_DIR");
  REQUIRE_MESSAGE(!cli.empty(), "DISTOPT_CLI is not set (run through ctest)");
  const std::string dir = distopt::test::make_temp_dir("distopt_lrsched_check");
  const std::string job = "plugins: {paths: [" + plugins +
                          "]}\ncommunicator: {name: tcp}\noptimizer:\n  name: sgd\n"
                          "  lr_schedule: {kind: multi_step, milestones: [10, 10]}\n";
  std::ofstream(dir + "/bad.yaml") << job;
  for (const char* cmd : {"check", "train"}) {
    CAPTURE(cmd);
    ProcResult r = run_command({cli, cmd, dir + "/bad.yaml"}, {}, std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("bad.yaml:5:") != std::string::npos);
    CHECK(
        r.output.find("optimizer.lr_schedule.milestones: expected increasing positive integers") !=
        std::string::npos);
  }
  distopt::test::remove_tree(dir);
}
