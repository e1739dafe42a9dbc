// Helpers of the hybrid tests: the job's YAML, a rank's training steps on
// its own batch (rank_steps.hpp's seeding), and the single-process libtorch
// reference on the averaged gradient. Mlp3 (in 20 -> 32 -> 16 -> 10) has
// 1370 trainable elements: fc1.weight 640, fc1.bias 32, fc2.weight 512,
// fc2.bias 16, fc3.weight 160, fc3.bias 10; fc2 is parameter group 1 (lr
// 0.02, weight decay 0.05), so at offload_fraction 0.5 (fc1.*, fc2.weight on
// the host) one group is split between host and device. Brings doctest in
// (after libtorch, as torch_doctest.hpp requires).
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <chrono>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "rank_steps.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"  // after libtorch

namespace distopt::test {

constexpr int kHalfway = 5;  // the learning rate of group 1 drops here (set_lr)

/// optimizer YAML by short name: sgd (momentum 0.9, nesterov off) or adam.
inline std::string optimizer_yaml(const std::string& name) {
  return name == "sgd" ? "{name: sgd, lr: 0.05, momentum: 0.9}" : "{name: adam, lr: 0.01}";
}

/// A job of `world` ranks on 127.0.0.1:`port` with `algorithm` (YAML flow).
inline std::string hybrid_job(int world, int port, const std::string& algorithm,
                              const std::string& optimizer) {
  std::ostringstream y;
  y << plugins_and_world_yaml(world, port) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean, options: {bucket_cap_mb: 0.002}}\n"  // several buckets
    << "algorithm: " << algorithm << "\noptimizer: " << optimizer_yaml(optimizer) << "\n";
  return y.str();
}

/// The distributed optimizer of `net` with fc2 as group 1.
inline distopt::DistributedOptimizer make_hybrid_optimizer(distopt::Runtime& rt, Mlp3& net) {
  distopt::ParamGroupSpec g1;
  g1.names = {"fc2.weight", "fc2.bias"};
  g1.lr = 0.02;
  g1.weight_decay = 0.05;
  return rt.make_optimizer(*net, {distopt::ParamGroupSpec{}, g1});
}

/// Steps [from, to) of a rank: set_lr of group 1 at kHalfway, then
/// random_batch_step.
inline void train_steps(Mlp3& net, distopt::DistributedOptimizer& opt, int rank, int from, int to) {
  for (int s = from; s < to; ++s) {
    if (s == kHalfway) opt.set_lr(0.005, 1);
    random_batch_step(net, opt, rank, s);
  }
}

/// libtorch's optimizer `name` over `net` with fc2 as group 1 (as above).
inline std::unique_ptr<torch::optim::Optimizer> reference_optimizer(const std::string& name,
                                                                    Mlp3& net) {
  std::vector<at::Tensor> g0, g1;
  for (auto& np : net->named_parameters())
    (np.key().rfind("fc2.", 0) == 0 ? g1 : g0).push_back(np.value());
  auto build = [&](auto d) {
    using O = decltype(d);
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(g0, std::make_unique<O>(d));
    auto o = std::make_unique<O>(d);
    o->lr(0.02).weight_decay(0.05);
    g.emplace_back(g1, std::move(o));
    return g;
  };
  if (name == "sgd") {
    auto d = torch::optim::SGDOptions(0.05).momentum(0.9);
    return std::make_unique<torch::optim::SGD>(build(d), d);
  }
  auto d = torch::optim::AdamOptions(0.01);
  return std::make_unique<torch::optim::Adam>(build(d), d);
}

/// One process: Mlp3 from seed 42, `worlds.size()` steps; step s averages
/// the gradients of ranks 0 .. worlds[s] - 1 on their random_batch_step
/// batches, group 1's lr drops at kHalfway; before step s, `before(s, net)`
/// may change the model (weights loaded). Returns the parameters as doubles.
inline std::vector<double> reference_run(
    const std::string& optimizer, const std::vector<int>& worlds,
    const std::function<void(int, Mlp3&)>& before = [](int, Mlp3&) {}) {
  distopt::test::seed_cpu(42);
  Mlp3 net;
  auto opt = reference_optimizer(optimizer, net);
  for (int s = 0; s < static_cast<int>(worlds.size()); ++s) {
    before(s, net);
    if (s == kHalfway) opt->param_groups()[1].options().set_lr(0.005);
    opt->zero_grad();
    for (int r = 0; r < worlds[s]; ++r) {
      // random_batch_step's batch, drawn by the same expression: the order in
      // which its two arguments draw is the compiler's.
      distopt::test::seed_cpu(10000 * (r + 1) + s);
      at::nll_loss(at::log_softmax(net->forward(at::randn({8, 20})), 1), at::randint(0, 10, {8}))
          .backward();
    }
    {
      at::NoGradGuard ng;
      for (auto& p : net->parameters()) p.mutable_grad().div_(worlds[s]);
    }
    opt->step();
  }
  return flat_params(net);
}

/// Per job of run_jobs: every rank's parameters and optimizer state bytes.
struct Outcome {
  std::vector<std::vector<double>> params;  // per rank
  std::vector<double> state_bytes;          // per rank
};

/// Runs each job YAML of `jobs` on `world` forked ranks (every rank runs
/// them in turn, each with its own runtime): Mlp3 from seed 42,
/// make_hybrid_optimizer, train_steps 0 .. `steps`. Exchanges results via
/// files in `dir`; REQUIREs every rank to exit 0 within 240 s.
inline std::vector<Outcome> run_jobs(const std::vector<std::string>& jobs, int world, int steps,
                                     const std::string& dir) {
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        for (size_t j = 0; j < jobs.size(); ++j) {
          distopt::test::seed_cpu(42);
          Mlp3 net;
          auto rt = rank_runtime(jobs[j], rank, world, "hybrid.yaml");
          auto opt = make_hybrid_optimizer(rt, net);
          train_steps(net, opt, rank, 0, steps);
          const std::string tag = "job" + std::to_string(j);
          write_doubles(rank_file(dir, tag, rank), flat_params(net));
          write_doubles(rank_file(dir, tag + "_state", rank),
                        {static_cast<double>(opt.state_bytes())});
          rt.barrier();
        }
        return 0;
      },
      std::chrono::seconds(240));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
  }
  std::vector<Outcome> out(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j)
    for (int r = 0; r < world; ++r) {
      const std::string tag = "job" + std::to_string(j);
      out[j].params.push_back(read_doubles(rank_file(dir, tag, r)));
      out[j].state_bytes.push_back(read_doubles(rank_file(dir, tag + "_state", r)).at(0));
    }
  return out;
}

/// Rank 0's parameters equal the libtorch `reference` to 1e-6 (float
/// rounding of another summation order), and every rank's equal rank 0's
/// bitwise.
inline void check_ranks_equal_reference(const std::vector<std::vector<double>>& params,
                                        const std::vector<double>& reference) {
  CHECK(max_abs_diff(params[0], reference) <= 1e-6);
  for (size_t r = 1; r < params.size(); ++r) CHECK(max_abs_diff(params[r], params[0]) == 0);
}

}  // namespace distopt::test
