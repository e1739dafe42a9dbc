// Helpers of the decentralized tests that run ranks in-process
// (gossip_test, low_precision_test): the job's YAML, per-rank starting
// replicas, parameters as doubles, per-rank result files, and a least-squares
// problem with different data per rank. Include before torch_doctest.hpp.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "rank_steps.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"

namespace distopt::test {

/// The communicator's timeout in the jobs of job_yaml: a broken exchange
/// protocol (a receive no peer ever sends to) ends each test case in an
/// error naming the peer after this long, instead of every case running
/// into the world's 60 s and the whole test into ctest's timeout. The
/// longest legitimate wait is a rank starting late under load (seconds).
constexpr int kCommTimeoutS = 20;

/// A job of `world` ranks on loopback with `algorithm` (YAML flow text),
/// reducer mean (options `reducer_options`), optimizer `optimizer`; tcp
/// with timeout_s kCommTimeoutS.
inline std::string job_yaml(int world, const std::string& algorithm,
                            const std::string& optimizer = "{name: sgd, lr: 0.05, momentum: 0.9}",
                            const std::string& reducer_options = "{}") {
  std::ostringstream y;
  y << plugins_and_world_yaml(world, random_port())
    << "communicator: {name: tcp, options: {timeout_s: " << kCommTimeoutS << "}}\n"
    << "reducer: {name: mean, options: " << reducer_options << "}\nalgorithm: " << algorithm
    << "\noptimizer: " << optimizer << "\n";
  return y.str();
}

/// Every rank starts from its own parameters (make_optimizer broadcast rank 0's).
inline void scatter_replicas(Mlp3& net, int rank) {
  at::NoGradGuard ng;
  distopt::test::seed_cpu(1000 + rank);
  for (auto& p : net->parameters()) p.copy_(at::randn_like(p));
}

/// (name, tensor) pairs flattened to doubles, in order.
inline std::vector<double> to_doubles(const std::vector<std::pair<std::string, at::Tensor>>& ps) {
  std::vector<double> v;
  for (const auto& [name, t] : ps) {
    at::Tensor c = t.to(at::kDouble).contiguous().view(-1);
    v.insert(v.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return v;
}

/// Rank r of 4 minimises ||A_r x - b_r||^2 / m (6 unknowns, 24 rows, data
/// drawn from seed 500 + r, shifted per rank); the job minimises their sum.
struct LeastSquares {
  static constexpr int kWorld = 4, kDim = 6, kRows = 24, kSteps = 2000;

  /// Rank r's (A_r, b_r), float32.
  static std::pair<at::Tensor, at::Tensor> data(int rank) {
    distopt::test::seed_cpu(500 + rank);
    at::Tensor a = at::randn({kRows, kDim}) + 0.5 * rank;
    at::Tensor b = at::randn({kRows, 1}) + rank;
    return {a, b};
  }

  /// The exact optimum of the sum, from the normal equations (float64).
  static std::vector<double> optimum() {
    at::Tensor ata = at::zeros({kDim, kDim}, at::kDouble), atb = at::zeros({kDim, 1}, at::kDouble);
    for (int r = 0; r < kWorld; ++r) {
      auto [a, b] = data(r);
      ata += a.to(at::kDouble).t().mm(a.to(at::kDouble));
      atb += a.to(at::kDouble).t().mm(b.to(at::kDouble));
    }
    const at::Tensor xs = at::linalg_solve(ata, atb).view(-1).contiguous();
    return std::vector<double>(xs.data_ptr<double>(), xs.data_ptr<double>() + kDim);
  }

  /// Train kSteps full-batch SGD steps with `algorithm` (lr 0.01, 0.001 from
  /// the middle on: D-PSGD's bias shrinks with the step size; lr * L must
  /// keep W - lr * H stable, W's eigenvalues reach -1/3 on a ring of 4).
  /// Returns the mean of the replicas followed by the consensus distance, or
  /// an empty vector when a rank failed.
  static std::vector<double> run(const std::string& algorithm, const std::string& dir,
                                 const std::string& tag) {
    const std::string job = job_yaml(kWorld, algorithm, "{name: sgd, lr: 0.01}");
    auto codes = fork_ranks(kWorld, [&](int rank) {
      torch::set_num_threads(1);
      const auto [a, b] = data(rank);
      distopt::test::seed_cpu(3);
      torch::nn::Linear lin(torch::nn::LinearOptions(kDim, 1).bias(false));
      auto rt = rank_runtime(job, rank, kWorld, "lsq.yaml");
      auto opt = rt.make_optimizer(*lin);
      for (int t = 0; t < kSteps; ++t) {
        if (t == kSteps / 2) opt.set_lr(0.001);
        opt.zero_grad();
        (lin->forward(a) - b).pow(2).mean().backward();
        opt.step();
      }
      auto avg = opt.average_replicas();
      auto v = to_doubles(avg.params);
      v.push_back(avg.consensus_distance);
      if (rank == 0) write_doubles(dir + "/" + tag + ".bin", v);
      return 0;
    });
    for (int c : codes)
      if (c != 0) return {};
    return read_doubles(dir + "/" + tag + ".bin");
  }

  /// The D-PSGD iteration run() drives, x_i <- sum_j W_ij x_j - lr g_i(x_i)
  /// on a ring of kWorld (W_ij = 1/3 for i, its left and its right), in
  /// float64 from the same initial weights and data: the replicas' mean
  /// followed by their consensus distance, as run() returns them.
  static std::vector<double> simulate_ring() {
    distopt::test::seed_cpu(3);  // run()'s initial weights
    torch::nn::Linear lin(torch::nn::LinearOptions(kDim, 1).bias(false));
    const at::Tensor x0 = lin->weight.detach().to(at::kDouble).view({kDim, 1});
    std::vector<at::Tensor> a, b, x;
    for (int r = 0; r < kWorld; ++r) {
      auto [ar, br] = data(r);
      a.push_back(ar.to(at::kDouble));
      b.push_back(br.to(at::kDouble));
      x.push_back(x0.clone());
    }
    for (int t = 0; t < kSteps; ++t) {
      const double lr = t < kSteps / 2 ? 0.01 : 0.001;
      std::vector<at::Tensor> next;
      for (int i = 0; i < kWorld; ++i) {
        const int left = (i + kWorld - 1) % kWorld, right = (i + 1) % kWorld;
        const at::Tensor grad = a[i].t().mm(a[i].mm(x[i]) - b[i]) * (2.0 / kRows);
        next.push_back((x[i] + x[left] + x[right]) / 3.0 - lr * grad);
      }
      x = next;
    }
    at::Tensor mean = (x[0] + x[1] + x[2] + x[3]) / kWorld;
    double consensus = 0;
    for (const auto& xi : x) consensus += (xi - mean).pow(2).sum().item<double>() / kWorld;
    mean = mean.view(-1).contiguous();
    std::vector<double> out(mean.data_ptr<double>(), mean.data_ptr<double>() + kDim);
    out.push_back(consensus);
    return out;
  }

  /// Euclidean norm of `v`.
  static double norm(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s);
  }
};

}  // namespace distopt::test
