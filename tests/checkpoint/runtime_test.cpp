// Runtime checkpoint API details on one process (world size 1): learning
// rates set with set_lr survive a resume, `keep`, find_checkpoint, and the
// online consolidate of a single rank.
#include "distopt/runtime.hpp"

#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <fstream>
#include <sstream>

#include "distopt/checkpoint.hpp"
#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

std::string job_text() {
  return "plugins: {paths: [" + distopt::test::env_path("DISTOPT_PLUGIN_DIR") +
         "]}\n"
         "world: {size: 1}\ncommunicator: {name: tcp}\nreducer: {name: mean}\n"
         "algorithm: {name: allreduce}\noptimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n";
}

distopt::Runtime runtime() {
  distopt::ProcessInfo proc;
  proc.source = "test";
  return distopt::Runtime::from_config(distopt::parse_job_config(job_text(), "job.yaml"), proc);
}

void train(torch::nn::Linear& net, distopt::DistributedOptimizer& opt, int steps, int seed) {
  distopt::test::seed_cpu(seed);
  for (int i = 0; i < steps; ++i) {
    auto x = torch::randn({8, 4});
    opt.zero_grad();
    net->forward(x).pow(2).mean().backward();
    opt.step();
  }
}

struct TempDir {
  std::string path = distopt::test::make_temp_dir("distopt_ckpt_rt");
  ~TempDir() { distopt::test::remove_tree(path); }
};

}  // namespace

TEST_CASE("set_lr survives a resume; keep bounds the checkpoints; consolidate on one rank") {
  TempDir t;
  const std::string dir = t.path + "/ckpt";
  auto rt = runtime();

  // Uninterrupted: 5 steps at lr 0.1, then lr 0.01 for 5 + 5 steps.
  distopt::test::seed_cpu(1);
  torch::nn::Linear ref(4, 3);
  auto ref_opt = rt.make_optimizer(*ref);
  train(ref, ref_opt, 5, 10);
  ref_opt.set_lr(0.01);
  train(ref, ref_opt, 5, 11);
  train(ref, ref_opt, 5, 12);

  distopt::test::seed_cpu(1);
  torch::nn::Linear a(4, 3);
  auto opt_a = rt.make_optimizer(*a);
  train(a, opt_a, 5, 10);
  rt.save_checkpoint(dir, *a, opt_a, {{"note", "first"}}, /*keep=*/2);
  opt_a.set_lr(0.01);
  train(a, opt_a, 5, 11);
  auto info = rt.save_checkpoint(dir, *a, opt_a, {{"note", "second"}}, 2);
  CHECK(info.step == 10);
  CHECK(info.extra.at("note") == "second");
  auto found = distopt::find_checkpoint(dir);
  REQUIRE(found.has_value());
  CHECK(found->path == info.path);
  CHECK(found->algorithm == "allreduce/allreduce");
  CHECK(found->optimizer == "sgd");

  // A fresh optimizer has the config's lr 0.1; the checkpoint's 0.01 wins.
  distopt::test::seed_cpu(2);
  torch::nn::Linear b(4, 3);
  auto opt_b = rt.make_optimizer(*b);
  rt.load_checkpoint(dir, *b, opt_b);
  CHECK(opt_b.steps() == 10);
  train(b, opt_b, 5, 12);
  CHECK(torch::equal(b->weight, ref->weight));
  CHECK(torch::equal(b->bias, ref->bias));

  // keep = 2 over three saves: the oldest goes.
  rt.save_checkpoint(dir, *b, opt_b, {}, 2);
  std::vector<std::string> steps;
  for (const std::string& name : distopt::test::list_dir(dir))
    if (distopt::test::is_dir(dir + "/" + name)) steps.push_back(name);
  std::sort(steps.begin(), steps.end());
  CHECK(steps == std::vector<std::string>{"step-000000010", "step-000000015"});

  // Saving twice at one step never overwrites the committed checkpoint.
  auto again = rt.save_checkpoint(dir, *b, opt_b, {}, 3);
  CHECK(again.path == dir + "/step-000000015-1");

  auto all = rt.consolidate(*b, opt_b, 0);
  REQUIRE(all.count("model/weight"));
  CHECK(torch::equal(all.at("model/weight"), b->weight));
  REQUIRE(all.count("algorithm/optimizer/weight/momentum_buffer"));
  CHECK(all.at("algorithm/optimizer/weight/momentum_buffer").sizes() == b->weight.sizes());
  CHECK_THROWS_AS(rt.consolidate(*b, opt_b, 1), distopt::ConfigError);
  CHECK_THROWS_AS(rt.save_checkpoint(dir, *b, opt_b, {}, 0), distopt::ConfigError);
  CHECK_THROWS_WITH_AS(rt.load_checkpoint(t.path + "/none", *b, opt_b),
                       doctest::Contains("no checkpoint (no 'latest' file)"),
                       distopt::CheckpointError);
}

TEST_CASE("a reducer built for ABI 1.0 trains, and checkpointing with it fails naming it") {
  TempDir t;
  std::string text = job_text();
  text.replace(text.find("reducer: {name: mean}"), 21, "reducer: {name: abi10_mean}");
  text.replace(text.find("paths: ["), 8,
               "paths: [" + distopt::test::env_path("DISTOPT_ABI10_PLUGIN_DIR") + ", ");
  distopt::ProcessInfo proc;
  proc.source = "test";
  auto rt = distopt::Runtime::from_config(distopt::parse_job_config(text, "job.yaml"), proc);
  distopt::test::seed_cpu(1);
  torch::nn::Linear net(4, 3);
  auto opt = rt.make_optimizer(*net);
  auto before = net->weight.clone();
  train(net, opt, 3, 5);
  CHECK_FALSE(torch::equal(before, net->weight));  // it trains
  try {
    rt.save_checkpoint(t.path + "/c", *net, opt);
    FAIL("save_checkpoint with an ABI 1.0 reducer did not throw");
  } catch (const distopt::ComponentError& e) {
    const std::string msg = e.what();
    CHECK(e.status() == DOPT_ERR_UNSUPPORTED);
    CHECK(msg.find("abi10/abi10_mean") != std::string::npos);
    CHECK(msg.find("libdistopt_abi10.so was built for ABI 1.0") != std::string::npos);
  }
  CHECK_FALSE(distopt::find_checkpoint(t.path + "/c").has_value());
}

TEST_CASE("the manifest writes floating-point options so that they read back exactly") {
  TempDir t;
  const std::string dir = t.path + "/ckpt";
  distopt::ProcessInfo proc;
  proc.source = "test";
  std::string text = job_text();
  text.replace(text.find("optimizer: {name: sgd, lr: 0.1, momentum: 0.9}"),
               std::string("optimizer: {name: sgd, lr: 0.1, momentum: 0.9}").size(),
               "optimizer: {name: adam, lr: 0.001, eps: 1e-8, weight_decay: 0.3}");
  auto rt = distopt::Runtime::from_config(distopt::parse_job_config(text, "job.yaml"), proc);
  distopt::test::seed_cpu(1);
  torch::nn::Linear net(4, 3);
  auto opt = rt.make_optimizer(*net);
  train(net, opt, 1, 2);
  auto info = rt.save_checkpoint(dir, *net, opt);
  std::ifstream in(info.path + "/manifest.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string m = ss.str();
  INFO(m);
  CHECK(m.find("\"eps\": \"1e-08\"") != std::string::npos);  // was "0.000000"
  CHECK(m.find("\"lr\": \"0.001\"") != std::string::npos);
  CHECK(m.find("\"weight_decay\": \"0.3\"") != std::string::npos);
}
