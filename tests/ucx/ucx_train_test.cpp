// `distopt train` with communicator ucx (default transports and UCX_TLS=tcp)
// on 2 ranks: the run succeeds and ends where the same job over tcp ends
// (same loss and accuracy: both reduce with one chain per element).
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "multiproc.hpp"
#include "train_metrics.hpp"

using namespace distopt::test;

namespace {

// The quickstart job, 40 steps, over `communicator`; returns the final line.
std::string train(const std::string& communicator, const std::vector<std::string>& env) {
  const std::string yaml = "/tmp/distopt_ucx_train_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(yaml) << "world: {size: 2, rendezvous: 'tcp://127.0.0.1:29500', timeout_s: 60}\n"
                      << "communicator: {name: " << communicator << "}\n"
                      << "reducer: {name: mean}\nalgorithm: {name: allreduce}\n"
                      << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
                      << "train: {model: mlp, dataset: fashion-mnist, data_dir: "
                      << kFashionMnistDir
                      << ", epochs: 1, batch_size: 256, seed: 0, threads: 1, max_steps: 40}\n";
  auto res = run_command(
      {env_path("DISTOPT_CLI"), "train", yaml, "--plugin-path", env_path("DISTOPT_PLUGIN_DIR")},
      env, std::chrono::seconds(300));
  std::remove(yaml.c_str());
  CAPTURE(res.output);
  REQUIRE(res.exit_code == 0);
  const auto at = res.output.find("final test accuracy:");
  REQUIRE(at != std::string::npos);
  return res.output.substr(at, res.output.find('\n', at) - at);
}

}  // namespace

TEST_CASE("distopt train over ucx (default and UCX_TLS=tcp) ends exactly where tcp does") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string tcp = train("tcp", {});
  MESSAGE("tcp: " << tcp);
  CHECK(train("ucx", {}) == tcp);
  CHECK(train("ucx", {"UCX_TLS=tcp"}) == tcp);
}
