// Checkpoints of the algorithm plugins (allreduce, zero, fused) across real
// processes on loopback (tcp + mean + the algorithm). Each case:
//   run A: W ranks train 10 steps, save_checkpoint, train 10 more (saving
//          must not disturb training: A equals uninterrupted training);
//   run B: fresh processes, a fresh model (other init) and optimizer,
//          load_checkpoint, train steps 10..19.
// B must equal A (bitwise where world size and algorithm are the same, else
// 1e-6) and single-process libtorch on the global batch (1e-5). The global
// batch is 12 samples per step whatever W is (12 / W per rank), so
// checkpoints move between world sizes (ZeRO resharding) and algorithms
// (shared keys optimizer/<param>/<field>) without changing the reference.
// Pattern of tests/zero/zero_test.cpp: forked children do all torch work.
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10;
constexpr int kGlobalBatch = 12;  // divisible by 2, 3 and 4 ranks
constexpr int kSteps = 20, kSaveAt = 10;
constexpr uint64_t kInitSeed = 42, kDataSeed = 1234;

using Net = Mlp3;  // kIn (20) -> 32 -> 16 -> kClasses (10)

// Inner optimizers (same hyperparameters in YAML and in the reference).
std::string optimizer_yaml(const std::string& name) {
  if (name == "sgd") return "{name: sgd, lr: 0.05, momentum: 0.9}";
  if (name == "adam") return "{name: adam, lr: 0.01}";
  if (name == "adamw") return "{name: adamw, lr: 0.01, weight_decay: 0.1}";
  if (name == "adagrad") return "{name: adagrad, lr: 0.05}";
  return "{name: rmsprop, lr: 0.001, momentum: 0.5, centered: true}";
}

std::unique_ptr<torch::optim::Optimizer> reference_optimizer(const std::string& name, Net& net) {
  auto p = net->parameters();
  if (name == "sgd")
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  if (name == "adam")
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  if (name == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  if (name == "adagrad")
    return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.05));
  return std::make_unique<torch::optim::RMSprop>(
      p, torch::optim::RMSpropOptions(0.001).momentum(0.5).centered(true));
}

// One distributed job: algorithm, its options, the world size.
struct Job {
  std::string algorithm = "allreduce";
  std::string options = "{}";
  int world = 2;
};

at::Tensor loss_of(Net& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(at::log_softmax(net->forward(x), 1), y);
}

std::pair<at::Tensor, at::Tensor> data() {
  distopt::test::seed_cpu(kDataSeed);
  return {at::randn({kGlobalBatch * kSteps, kIn}),
          at::randint(0, kClasses, {kGlobalBatch * kSteps})};
}

// Single-process libtorch, kSteps steps on the global batch (computed once
// per optimizer; init.bin is written to `dir` on the first call only).
std::vector<double> reference(const std::string& optimizer, const std::string& dir) {
  static std::map<std::string, std::vector<double>> cache;
  if (auto it = cache.find(optimizer); it != cache.end()) return it->second;
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    auto [x, y] = data();
    distopt::test::seed_cpu(kInitSeed);
    Net net;
    write_doubles(dir + "/init.bin", flat_params(net));
    auto opt = reference_optimizer(optimizer, net);
    for (int step = 0; step < kSteps; ++step) {
      opt->zero_grad();
      loss_of(net, x.narrow(0, step * kGlobalBatch, kGlobalBatch),
              y.narrow(0, step * kGlobalBatch, kGlobalBatch))
          .backward();
      opt->step();
    }
    write_doubles(dir + "/ref.bin", flat_params(net));
    return 0;
  });
  REQUIRE(codes[0] == 0);
  auto ref = read_doubles(dir + "/ref.bin");
  REQUIRE(max_abs_diff(ref, read_doubles(dir + "/init.bin")) > 1e-3);  // training moves them
  return cache[optimizer] = ref;
}

// What one rank of a distributed run does.
struct Phase {
  bool load = false;  // load_checkpoint(ckpt) before training (fresh init otherwise)
  int from = 0;       // train steps [from, kSteps)
  int save_at = -1;   // save_checkpoint(ckpt) after this many steps (-1: never)
};

// Run `job` with `optimizer` on job.world ranks; returns each rank's
// parameters after the last step. `tag` names the result files.
std::vector<std::vector<double>> run_job(const Job& job, const std::string& optimizer,
                                         const Phase& phase, const std::string& dir,
                                         const std::string& tag) {
  std::ostringstream yaml;
  yaml << plugins_and_world_yaml(job.world, random_port()) << "communicator: {name: tcp}\n"
       << "reducer: {name: mean}\n"
       << "algorithm: {name: " << job.algorithm << ", options: " << job.options << "}\n"
       << "optimizer: " << optimizer_yaml(optimizer) << "\n";
  const std::string text = yaml.str();
  const std::string ckpt = dir + "/ckpt";
  const int batch = kGlobalBatch / job.world;
  auto codes = fork_ranks(
      job.world,
      [&](int rank) {
        torch::set_num_threads(1);
        auto [x, y] = data();
        // Another init than the reference's: a loaded run must take the
        // parameters from the checkpoint, a fresh one from rank 0's broadcast.
        distopt::test::seed_cpu((phase.load ? 999 : kInitSeed) + 7 * rank);
        Net net;
        auto rt = rank_runtime(text, rank, job.world);
        auto opt = rt.make_optimizer(*net);
        if (phase.load) {
          auto info = rt.load_checkpoint(ckpt, *net, opt);
          if (info.step != phase.from) {
            fprintf(stderr, "rank %d: checkpoint step %lld, expected %d\n", rank,
                    static_cast<long long>(info.step), phase.from);
            return 3;
          }
        }
        for (int step = phase.from; step < kSteps; ++step) {
          opt.zero_grad();
          auto off = step * kGlobalBatch + rank * batch;
          loss_of(net, x.narrow(0, off, batch), y.narrow(0, off, batch)).backward();
          opt.step();
          if (step + 1 == phase.save_at) rt.save_checkpoint(ckpt, *net, opt);
        }
        write_doubles(dir + "/" + tag + std::to_string(rank) + ".bin", flat_params(net));
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(60));
  std::vector<std::vector<double>> out;
  for (int r = 0; r < job.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    out.push_back(read_doubles(dir + "/" + tag + std::to_string(r) + ".bin"));
  }
  return out;
}

// Save with `saver` at step 10, load into `loader`, compare. `exact`: the
// resumed run must equal the saver's uninterrupted one bit for bit.
void save_and_resume(const Job& saver, const Job& loader, const std::string& optimizer,
                     bool exact) {
  TempDir dir("distopt_ckpt_alg");
  const auto ref = reference(optimizer, dir.path);

  const auto a = run_job(saver, optimizer, {false, 0, kSaveAt}, dir.path, "a");
  const auto b = run_job(loader, optimizer, {true, kSaveAt, -1}, dir.path, "b");
  for (size_t r = 0; r < a.size(); ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(a[r], ref) <= 1e-5);
    CHECK(max_abs_diff(a[r], a[0]) == 0);
  }
  for (size_t r = 0; r < b.size(); ++r) {
    CAPTURE(r);
    const double to_a = max_abs_diff(b[r], a[0]), to_ref = max_abs_diff(b[r], ref);
    CAPTURE(to_a);
    CAPTURE(to_ref);
    if (r == 0) MESSAGE("resumed run vs uninterrupted: " << to_a << ", vs libtorch: " << to_ref);
    if (exact)
      CHECK(to_a == 0);
    else  // another world size or algorithm: other summation order in the reduction
      CHECK(to_a <= 1e-6);
    CHECK(to_ref <= 1e-5);
    CHECK(max_abs_diff(b[r], b[0]) == 0);
  }
}

void resume_same(const Job& job, const std::string& optimizer) {
  save_and_resume(job, job, optimizer, true);
}

Job zero(const std::string& options, int world) { return {"zero", options, world}; }

}  // namespace

TEST_CASE("resume: allreduce, SGD momentum and Adagrad, 2 ranks") {
  resume_same({"allreduce", "{}", 2}, "sgd");
  resume_same({"allreduce", "{}", 2}, "adagrad");
}

TEST_CASE("resume: fused, Adam and SGD momentum, 2 ranks") {
  resume_same({"fused", "{}", 2}, "adam");
  resume_same({"fused", "{do_flatten: false}", 2}, "sgd");
}

TEST_CASE("resume: zero stage 1 greedy, AdamW, 2 ranks") {
  resume_same(zero("{stage: 1, partition: greedy}", 2), "adamw");
}

TEST_CASE("resume: zero stage 1 contiguous, Adam (bucket view), 2 ranks") {
  resume_same(zero("{stage: 1, partition: contiguous, parameters_as_bucket_view: true}", 2),
              "adam");
}

TEST_CASE("resume: zero stage 2, SGD momentum and RMSprop (centered, momentum), 2 ranks") {
  resume_same(zero("{stage: 2, partition: contiguous}", 2), "sgd");
  resume_same(zero("{stage: 2, partition: greedy}", 2), "rmsprop");
}

TEST_CASE("reshard: zero Adam, 4 ranks -> 2 and 2 -> 3, contiguous and greedy") {
  const std::string contiguous = "{stage: 1, partition: contiguous}";
  const std::string greedy = "{stage: 1, partition: greedy}";
  SUBCASE("contiguous 4 -> 2") {
    save_and_resume(zero(contiguous, 4), zero(contiguous, 2), "adam", false);
  }
  SUBCASE("greedy 4 -> 2") { save_and_resume(zero(greedy, 4), zero(greedy, 2), "adam", false); }
  SUBCASE("contiguous 2 -> 3") {
    save_and_resume(zero(contiguous, 2), zero(contiguous, 3), "adam", false);
  }
  SUBCASE("greedy 2 -> 3") { save_and_resume(zero(greedy, 2), zero(greedy, 3), "adam", false); }
  SUBCASE("stage 2, 4 -> 2") {
    save_and_resume(zero("{stage: 2}", 4), zero("{stage: 2}", 2), "adam", false);
  }
  SUBCASE("stage 2 (2 ranks) -> stage 1 greedy (3 ranks)") {
    save_and_resume(zero("{stage: 2}", 2), zero(greedy, 3), "adam", false);
  }
}

TEST_CASE("cross-algorithm: allreduce <-> zero <-> fused, Adam") {
  SUBCASE("allreduce (2) -> zero stage 1 contiguous (2)") {
    save_and_resume({"allreduce", "{}", 2}, zero("{stage: 1, partition: contiguous}", 2), "adam",
                    false);
  }
  SUBCASE("zero stage 2 (3) -> fused (2)") {
    save_and_resume(zero("{stage: 2}", 3), {"fused", "{}", 2}, "adam", false);
  }
  SUBCASE("fused (2) -> allreduce (3)") {
    save_and_resume({"fused", "{}", 2}, {"allreduce", "{}", 3}, "adam", false);
  }
}

TEST_CASE("a checkpoint of another optimizer does not load: sgd into adam, named") {
  TempDir dir("distopt_ckpt_alg");
  struct Case {
    Job saver, loader;
  };
  const Case cases[] = {
      {{"allreduce", "{}", 2}, {"allreduce", "{}", 2}},
      {{"allreduce", "{}", 2}, zero("{stage: 1, partition: contiguous}", 2)},
      {{"zero", "{stage: 2}", 2}, {"fused", "{}", 2}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.saver.algorithm);
    CAPTURE(c.loader.algorithm);
    run_job(c.saver, "sgd", {false, kSteps - 2, kSteps - 1}, dir.path, "save");
    // The loader catches the error: the message must name the missing key.
    std::ostringstream yaml;
    yaml << plugins_and_world_yaml(c.loader.world, random_port())
         << "communicator: {name: tcp}\nreducer: {name: mean}\n"
         << "algorithm: {name: " << c.loader.algorithm << ", options: " << c.loader.options
         << "}\noptimizer: " << optimizer_yaml("adam") << "\n";
    const std::string text = yaml.str();
    auto codes = fork_ranks(
        c.loader.world,
        [&](int rank) {
          torch::set_num_threads(1);
          Net net;
          auto rt = rank_runtime(text, rank, c.loader.world);
          auto opt = rt.make_optimizer(*net);
          try {
            rt.load_checkpoint(dir.path + "/ckpt", *net, opt);
          } catch (const distopt::CheckpointError& e) {
            std::ofstream(dir.path + "/err" + std::to_string(rank) + ".txt")
                << "CheckpointError: " << e.what();
            return 0;
          } catch (const distopt::ComponentError& e) {
            std::ofstream(dir.path + "/err" + std::to_string(rank) + ".txt")
                << "ComponentError: " << e.what();
            return 0;
          }
          return 4;  // loaded: wrong
        },
        std::chrono::seconds(60));
    for (int r = 0; r < c.loader.world; ++r) {
      CAPTURE(r);
      CHECK(codes[r] == 0);
      const std::string msg = read_text(dir.path + "/err" + std::to_string(r) + ".txt");
      CAPTURE(msg);
      if (msg.rfind("CheckpointError: ", 0) == 0) {
        // The host compares the manifest's inner optimizer first.
        CHECK(msg.find(dir.path + "/ckpt/step-") != std::string::npos);
        CHECK(msg.find("'sgd'") != std::string::npos);
        CHECK(msg.find("'adam'") != std::string::npos);
      } else {
        // Else the plugin's load_state: adam looks for a parameter's step;
        // the sgd checkpoint has its momentum_buffer only.
        CHECK(msg.rfind("ComponentError: ", 0) == 0);
        CHECK(msg.find("optimizer/") != std::string::npos);
        CHECK(msg.find("/step'") != std::string::npos);
        CHECK(msg.find("momentum_buffer") != std::string::npos);
      }
    }
    distopt::test::remove_tree(dir.path + "/ckpt");
  }
}
