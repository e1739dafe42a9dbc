// The ABI 1.4 device rule beyond the host's own communicator calls, on real
// ranks over tcp on loopback (libtorch here is CPU-only: the "CUDA" side is
// a component that declares kDLCUDA only, or a DLTensor that claims kDLCUDA
// and is never read):
//  - the host refuses an algorithm, a reducer or an inner reducer that does
//    not declare the parameters' device (kDLCPU) when the optimizer is
//    built, naming it, what it declares and the parameter, before anything
//    is created; switch_to such a component changes nothing;
//  - a reducer's own calls through its dopt_comm_ref (and through a
//    communicator it split from it) are refused UNSUPPORTED with the host's
//    message before `tcp` is called.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"
#include "train_metrics.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10, kBatch = 8;

// A job over tcp with the build's plugins and the test-only devrule plugin.
std::string job_yaml(int world, const std::string& components) {
  std::ostringstream y;
  y << "plugins: {paths: ['" << env_path("DISTOPT_PLUGIN_DIR") << "', '"
    << DISTOPT_DEVRULE_PLUGIN_DIR << "']}\n"
    << "world: {size: " << world << ", rendezvous: 'tcp://127.0.0.1:" << random_port()
    << "', timeout_s: 60}\n"
    << "communicator: {name: tcp}\n"
    << "optimizer: {name: sgd, lr: 0.05}\n"
    << components;
  return y.str();
}

// One step of `opt` on a random batch (the model is Mlp3).
void train_step(Mlp3& net, distopt::DistributedOptimizer& opt, int seed) {
  distopt::test::seed_cpu(seed);
  opt.zero_grad();
  at::cross_entropy_loss(net->forward(at::randn({kBatch, kIn})), at::randint(0, kClasses, {kBatch}))
      .backward();
  opt.step();
}

// Per rank: the message of the ComponentError make_optimizer(net) threw (""
// when it built one). A refusal leaves no gradient hook behind: a backward
// afterwards must still run.
std::vector<std::string> build_on_ranks(int world, const std::string& components) {
  TempDir dir("distopt_devrule");
  const std::string job = job_yaml(world, components);
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        Mlp3 net(kIn, kClasses);
        auto rt = rank_runtime(job, rank, world, "devrule.yaml");
        std::string what;
        try {
          auto opt = rt.make_optimizer(*net);
        } catch (const distopt::ComponentError& e) {
          what = std::string(e.status() == DOPT_ERR_UNSUPPORTED ? "" : "[not UNSUPPORTED] ") +
                 e.what();
          at::cross_entropy_loss(net->forward(at::randn({kBatch, kIn})),
                                 at::randint(0, kClasses, {kBatch}))
              .backward();
        }
        std::ofstream(rank_file(dir.path, "what", rank)) << what;
        return 0;
      },
      std::chrono::seconds(120));
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
    out.push_back(read_text(rank_file(dir.path, "what", r)));
  }
  return out;
}

}  // namespace

TEST_CASE("an algorithm that declares kDLCUDA only is refused for a CPU model") {
  for (const std::string& what :
       build_on_ranks(1, "reducer: {name: mean}\nalgorithm: {name: cuda_only}\n")) {
    INFO(what);
    CHECK(what.find("devrule/cuda_only: create (host device rule) failed (UNSUPPORTED): "
                    "algorithm 'cuda_only' does not accept kDLCPU memory (it declares kDLCUDA): "
                    "parameter 'fc1.weight' is on kDLCPU; move the model to a device it declares "
                    "or choose another algorithm") == 0);
    CHECK(what.find("created (the host must refuse it)") == std::string::npos);
  }
}

TEST_CASE("a reducer, or an inner reducer, that declares kDLCUDA only is refused") {
  for (const std::string& what :
       build_on_ranks(1, "reducer: {name: cuda_only}\nalgorithm: {name: allreduce}\n")) {
    INFO(what);
    CHECK(what.find("devrule/cuda_only: create (host device rule) failed (UNSUPPORTED): reducer "
                    "'cuda_only' does not accept kDLCPU memory (it declares kDLCUDA): parameter "
                    "'fc1.weight' is on kDLCPU; move the model to a device it declares or choose "
                    "another reducer") == 0);
  }
  for (const std::string& what :
       build_on_ranks(1,
                      "reducer: {name: hierarchical, options: {variant: leader}, inner: {name: "
                      "cuda_only}}\nalgorithm: {name: allreduce}\n")) {
    INFO(what);
    CHECK(what.find("devrule/cuda_only: create (host device rule) failed (UNSUPPORTED): inner "
                    "reducer 'cuda_only' does not accept kDLCPU memory (it declares kDLCUDA): "
                    "parameter 'fc1.weight' is on kDLCPU (inner of reducer 'hierarchical')") == 0);
  }
}

TEST_CASE("components that declare kDLCPU build and step (the rule refuses only what it must)") {
  // mean + allreduce declare kDLCPU | kDLCUDA; hierarchical declares kDLCPU.
  for (const std::string& what :
       build_on_ranks(2, "reducer: {name: hierarchical}\nalgorithm: {name: allreduce}\n"))
    CHECK(what == "");
}

TEST_CASE("switch_to an algorithm that does not declare the parameters' device changes nothing") {
  constexpr int kWorld = 2;
  TempDir dir("distopt_devrule_switch");
  const std::string job = job_yaml(kWorld, "reducer: {name: mean}\nalgorithm: {name: allreduce}\n");
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(3);
        Mlp3 net(kIn, kClasses);
        auto rt = rank_runtime(job, rank, kWorld, "devrule.yaml");
        auto opt = rt.make_optimizer(*net);
        train_step(net, opt, 10 + rank);
        std::string what;
        try {
          opt.switch_to({"cuda_only", {}, {}, {}}, {"mean", {}, {}, {}});
          what = "no refusal";
        } catch (const distopt::Error& e) {
          what = e.what();
        }
        if (opt.algorithm_name() != "allreduce") what += " [algorithm changed]";
        train_step(net, opt, 20 + rank);  // the optimizer still works
        std::ofstream(rank_file(dir.path, "what", rank)) << what;
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    const std::string what = read_text(rank_file(dir.path, "what", r));
    INFO(what);
    CHECK(what.find("switch_to: rebuilding the optimizer (it is unchanged) failed (UNSUPPORTED)") ==
          0);
    CHECK(what.find("algorithm 'cuda_only' does not accept kDLCPU memory (it declares kDLCUDA): "
                    "parameter 'fc1.weight' is on kDLCPU") != std::string::npos);
    CHECK(what.find("[algorithm changed]") == std::string::npos);
  }
}

TEST_CASE("a reducer's kDLCUDA tensor through its dopt_comm_ref is refused before tcp") {
  // tcp itself would say "is not in host memory (tcp moves host memory only)".
  for (const std::string split : {"false", "true"}) {
    CAPTURE(split);
    const auto whats =
        build_on_ranks(2, "reducer: {name: cuda_probe, options: {via_split: " + split +
                              "}}\nalgorithm: {name: allreduce}\n");
    for (const std::string& what : whats) {
      INFO(what);
      CHECK(what.find("devrule/cuda_probe: create failed (UNSUPPORTED): communicator 'tcp' does "
                      "not accept kDLCUDA memory (it declares kDLCPU); copy the tensor to a "
                      "device it accepts or choose a communicator that declares kDLCUDA") == 0);
      CHECK(what.find("host memory only") == std::string::npos);
      CHECK(what.find("was not refused") == std::string::npos);
    }
  }
}

TEST_CASE("distopt train: a job whose algorithm does not declare train.device is refused") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir dir("distopt_devrule_train");
  const std::string job = dir.path + "/cuda_only.yaml";
  std::ofstream(job) << "plugins: {paths: ['" << env_path("DISTOPT_PLUGIN_DIR") << "', '"
                     << DISTOPT_DEVRULE_PLUGIN_DIR << "']}\n"
                     << "world: {size: 2, timeout_s: 30}\n"
                     << "communicator: {name: tcp}\nreducer: {name: mean}\n"
                     << "algorithm: {name: cuda_only}\n"
                     << "optimizer: {name: sgd, lr: 0.1}\n"
                     << "train: {model: mlp, epochs: 1, batch_size: 64, seed: 0, max_steps: 5, "
                        "threads: 1, device: cpu}\n";
  auto r = run_command({env_path("DISTOPT_CLI"), "train", job}, {}, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("algorithm 'cuda_only' does not accept kDLCPU memory (it declares "
                      "kDLCUDA): parameter '") != std::string::npos);
  CHECK(r.output.find("created (the host must refuse it)") == std::string::npos);
}
