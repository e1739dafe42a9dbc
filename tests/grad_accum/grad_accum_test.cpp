// Gradient accumulation: DistributedOptimizer::no_sync() and
// `train.grad_accumulation`. On real ranks over tcp, K micro-batches (the
// first K-1 backward passes under no_sync, each loss weighted 1/K) must end
// where one K-times batch does, for every kind of algorithm and reducer
// (exact ones to float tolerance, against a single-process libtorch run as
// well; lossy ones see the accumulated gradient once, so they too match the
// one-batch run to float tolerance), with the same bytes per step; and
// without no_sync two backward passes still fail as before.
#include <pthread.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
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

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kWorld = 2, kSteps = 4, kBatch = 12, kIn = 20, kClasses = 10;
constexpr double kLr = 0.05;

// This rank's batch of step `step` (the same in every run).
std::pair<at::Tensor, at::Tensor> batch(int rank, int step) {
  distopt::test::seed_cpu(10000 * (rank + 1) + step);
  at::Tensor x = at::randn({kBatch, kIn});
  return {x, at::randint(0, kClasses, {kBatch})};
}

at::Tensor loss_of(Mlp3& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(at::log_softmax(net->forward(x), 1), y);
}

// `micro` micro-batches per step; per rank its final parameters and bytes
// sent in dir/<what><rank>.bin.
void run(const std::string& dir, const std::string& components, int micro) {
  std::ostringstream y;
  y << plugins_and_world_yaml(kWorld, random_port()) << components
    << "optimizer: {name: sgd, lr: " << kLr << "}\n";
  const std::string job = y.str();
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(0);
        Mlp3 net(kIn, kClasses);
        auto rt = rank_runtime(job, rank, kWorld, "accum.yaml");
        auto opt = rt.make_optimizer(*net);
        for (int s = 0; s < kSteps; ++s) {
          auto [x, t] = batch(rank, s);
          opt.zero_grad();
          const int64_t m = kBatch / micro;
          for (int k = 0; k < micro; ++k) {
            at::Tensor l =
                loss_of(net, x.slice(0, k * m, (k + 1) * m), t.slice(0, k * m, (k + 1) * m)) /
                micro;
            if (k + 1 < micro) {
              auto accumulate = opt.no_sync();
              l.backward();
            } else {
              l.backward();
            }
          }
          opt.step();
        }
        write_doubles(rank_file(dir, "params", rank), flat_params(net));
        write_doubles(rank_file(dir, "bytes", rank), {static_cast<double>(opt.bytes_sent())});
        return 0;
      },
      std::chrono::seconds(180));
  for (int r = 0; r < kWorld; ++r) REQUIRE_MESSAGE(codes[r] == 0, "rank " << r);
}

// One process, plain libtorch SGD on both ranks' batches together, in a
// forked child: a backward in this process would keep the ranks forked
// later from running theirs where a GPU is present (fork_ranks).
std::vector<double> reference_in_process() {
  distopt::test::seed_cpu(0);
  Mlp3 net(kIn, kClasses);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  for (int s = 0; s < kSteps; ++s) {
    std::vector<at::Tensor> xs, ts;
    for (int r = 0; r < kWorld; ++r) {
      auto [x, t] = batch(r, s);
      xs.push_back(x);
      ts.push_back(t);
    }
    sgd.zero_grad();
    loss_of(net, at::cat(xs), at::cat(ts)).backward();
    sgd.step();
  }
  return flat_params(net);
}

std::vector<double> reference() {
  TempDir dir("distopt_accum_ref");
  const auto codes = fork_ranks(
      1,
      [&](int) {
        torch::set_num_threads(1);
        write_doubles(rank_file(dir.path, "ref", 0), reference_in_process());
        return 0;
      },
      std::chrono::seconds(120));
  REQUIRE(codes[0] == 0);
  return read_doubles(rank_file(dir.path, "ref", 0));
}

struct Case {
  const char* name;
  const char* yaml;
  bool exact;  // the mean of the gradients: compare with the reference too
};

const Case kCases[] = {
    {"allreduce + mean", "algorithm: {name: allreduce}\nreducer: {name: mean}\n", true},
    {"zero stage 2", "algorithm: {name: zero, options: {stage: 2}}\nreducer: {name: mean}\n", true},
    {"allreduce + powersgd",
     "algorithm: {name: allreduce}\n"
     "reducer: {name: powersgd, options: {rank: 2, start_iter: 1, min_compression_rate: 1}}\n",
     false},
    {"allreduce + topk with error feedback",
     "algorithm: {name: allreduce}\n"
     "reducer: {name: topk, options: {ratio: 0.1, min_k: 1, error_feedback: true}}\n",
     false},
    {"hybrid, half offloaded",
     "algorithm: {name: hybrid, options: {offload_fraction: 0.5}}\nreducer: {name: mean}\n", true},
};

}  // namespace

TEST_CASE("K micro-batches under no_sync equal one K-times batch, bytes unchanged") {
  const std::vector<double> ref = reference();
  for (const Case& c : kCases) {
    CAPTURE(c.name);
    TempDir one("distopt_accum1"), four("distopt_accum4");
    run(one.path, c.yaml, 1);
    run(four.path, c.yaml, 4);
    for (int r = 0; r < kWorld; ++r) {
      const auto a = read_doubles(rank_file(one.path, "params", r));
      const auto b = read_doubles(rank_file(four.path, "params", r));
      CHECK(max_abs_diff(a, b) <= 1e-5);
      if (c.exact) CHECK(max_abs_diff(b, ref) <= 1e-5);
      CHECK(read_doubles(rank_file(one.path, "bytes", r)) ==
            read_doubles(rank_file(four.path, "bytes", r)));
    }
    // The micro-batched ranks agree with each other.
    CHECK(read_doubles(rank_file(four.path, "params", 0)) ==
          read_doubles(rank_file(four.path, "params", 1)));
  }
}

TEST_CASE("without no_sync a second backward still fails; a step after no_sync sends") {
  const std::string job = plugins_and_world_yaml(kWorld, random_port()) +
                          "optimizer: {name: sgd, lr: 0.05}\nreducer: {name: mean, options: "
                          "{bucket_cap_mb: 0.0001}}\n";
  TempDir dir("distopt_accum_err");
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(0);
        Mlp3 net(kIn, kClasses);
        auto rt = rank_runtime(job, rank, kWorld, "accum.yaml");
        auto opt = rt.make_optimizer(*net);
        auto [x, t] = batch(rank, 0);
        // Only guarded backward passes, then step(): the accumulated
        // gradients are reduced (ranks end equal although their data differ).
        opt.zero_grad();
        {
          auto accumulate = opt.no_sync();
          loss_of(net, x, t).backward();
          loss_of(net, x, t).backward();
          try {
            auto nested = opt.no_sync();
            return 2;
          } catch (const distopt::Error&) {
          }
        }
        opt.step();
        write_doubles(rank_file(dir.path, "params", rank), flat_params(net));
        // Unguarded: the second backward finds its buckets sent.
        opt.zero_grad();
        loss_of(net, x, t).backward();
        try {
          loss_of(net, x, t).backward();
          return 3;
        } catch (const std::exception& e) {
          if (std::string(e.what()).find("already sent for reduction") == std::string::npos)
            return 4;
        }
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < kWorld; ++r) CHECK_MESSAGE(codes[r] == 0, "rank " << r);
  CHECK(read_doubles(rank_file(dir.path, "params", 0)) ==
        read_doubles(rank_file(dir.path, "params", 1)));
}

TEST_CASE("distopt train: train.grad_accumulation 4 ends where 1 does, same bytes") {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  REQUIRE_MESSAGE(read_text(data + "/t10k-labels-idx1-ubyte.gz").size() > 0,
                  "Fashion-MNIST missing: tools/setup.sh installs dataset-fashion-mnist");
  TempDir dir("distopt_accum_cli");
  auto train = [&](int k) {
    const std::string path = dir.path + "/k" + std::to_string(k) + ".yaml";
    std::ofstream(path) << "plugins: {paths: ['" << env_path("DISTOPT_PLUGIN_DIR") << "']}\n"
                        << "world: {size: 2, timeout_s: 60}\n"
                        << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
                        << "train: {model: mlp, epochs: 1, batch_size: 64, seed: 3, "
                           "max_steps: 15, log_every: 0, threads: 1, grad_accumulation: "
                        << k << "}\n";
    return run_command({env_path("DISTOPT_CLI"), "train", path}, {}, std::chrono::seconds(300));
  };
  auto after = [](const std::string& out, const std::string& key) {
    const size_t p = out.find(key);
    if (p == std::string::npos) return std::string();
    return out.substr(p + key.size(), out.find('\n', p) - p - key.size());
  };
  ProcResult one = train(1), four = train(4);
  INFO(one.output);
  INFO(four.output);
  REQUIRE(one.exit_code == 0);
  REQUIRE(four.exit_code == 0);
  const std::string a1 = after(one.output, "final test accuracy: ");
  const std::string a4 = after(four.output, "final test accuracy: ");
  REQUIRE(!a1.empty());
  REQUIRE(!a4.empty());
  // The same update up to float rounding: at most a few of 10000 test
  // predictions may differ.
  CHECK(std::abs(std::stod(a1) - std::stod(a4)) <= 0.05);
  CHECK(after(one.output, "bytes sent per rank: ") == after(four.output, "bytes sent per rank: "));
}

TEST_CASE("fork_ranks refuses to fork once autograd device threads run (GPU machines)") {
  // What a backward starts where a GPU is present: a thread named
  // pt_autograd_<device>. Stand in for it with a named thread.
  std::mutex mu;
  std::condition_variable cv;
  bool named = false, done = false;
  std::thread t([&] {
    pthread_setname_np(pthread_self(), "pt_autograd_0");
    std::unique_lock<std::mutex> lk(mu);
    named = true;
    cv.notify_all();
    cv.wait(lk, [&] { return done; });
  });
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return named; });
  }
  CHECK(has_thread_named("pt_autograd_"));
  CHECK_THROWS_WITH_AS(fork_ranks(1, [](int) { return 0; }),
                       doctest::Contains("a forked rank's backward would wait for them forever"),
                       std::logic_error);
  {
    std::lock_guard<std::mutex> lk(mu);
    done = true;
  }
  cv.notify_all();
  t.join();
  CHECK(!has_thread_named("pt_autograd_"));
  CHECK(fork_ranks(1, [](int) { return 0; })[0] == 0);
}
