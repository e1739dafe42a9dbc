// DistributedOptimizer::join (PyTorch's Join with DDP / ZeroRedundancyOptimizer):
// ranks run different numbers of steps, each calls join() after its last one.
// Every rank must end with the same parameters, equal to one libtorch process
// whose step t averages the gradients of the ranks still stepping at t (or
// divides by the world size with join.divide_by_initial_world_size).
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
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

constexpr int kIn = 20, kClasses = 10, kBatch = 8;
constexpr uint64_t kInitSeed = 42, kDataSeed = 99;

struct Spec {
  std::vector<int> steps;  // per rank
  std::string algorithm = "{name: allreduce}";
  std::string reducer = "{name: mean}";
  std::string optimizer = "sgd";  // sgd (momentum 0.9) | adam
  std::string extra_yaml;         // e.g. "join: {divide_by_initial_world_size: true}\n"
  bool divide_by_world = false;   // the reference divides by W (must match extra_yaml)
  bool reference = true;          // lossy reducers: only "equal on every rank"
  bool bf16 = false;              // the model computes in bf16 (extra_yaml sets precision)
  bool fp16_wire = false;         // the reference rounds as the fp16 reducer does
  Spec(std::vector<int> steps_, std::string algorithm_ = "{name: allreduce}",
       std::string reducer_ = "{name: mean}", std::string optimizer_ = "sgd")
      : steps(std::move(steps_)),
        algorithm(std::move(algorithm_)),
        reducer(std::move(reducer_)),
        optimizer(std::move(optimizer_)) {}
  int world() const { return static_cast<int>(steps.size()); }
  int max_steps() const { return *std::max_element(steps.begin(), steps.end()); }
};

std::unique_ptr<torch::optim::Optimizer> reference_optimizer(const Spec& s, Mlp3& net) {
  if (s.optimizer == "adam")
    return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::SGD>(net->parameters(),
                                             torch::optim::SGDOptions(0.05).momentum(0.9));
}

std::string optimizer_yaml(const Spec& s) {
  return s.optimizer == "adam" ? "{name: adam, lr: 0.01}" : "{name: sgd, lr: 0.05, momentum: 0.9}";
}

// Rank r's batch at step t.
std::pair<at::Tensor, at::Tensor> batch(const at::Tensor& x, const at::Tensor& y, int world, int t,
                                        int r) {
  const int64_t off = (static_cast<int64_t>(t) * world + r) * kBatch;
  return {x.narrow(0, off, kBatch), y.narrow(0, off, kBatch)};
}

at::Tensor loss_of(Mlp3& net, const std::pair<at::Tensor, at::Tensor>& b) {
  return at::nll_loss(at::log_softmax(net->forward(b.first).to(at::kFloat), 1), b.second);
}

// One step of the reference for the fp16 reducer, rounding exactly as the
// distributed run does: each rank's own gradient (the ranks back-propagate
// separately), scaled by W / active on the ranks still stepping (join), divided
// by W and rounded to half (round to nearest even); a joined rank sends zeros;
// the allreduce widens each pair to float, adds and rounds once (two ranks:
// one addition, in either order); the result is widened back to float.
template <class BatchOf>
void fp16_reference_step(const Spec& s, Mlp3& net, torch::optim::Optimizer& opt, BatchOf batch_of,
                         int t) {
  REQUIRE(s.world() == 2);  // more ranks: the ring's addition order would matter
  const auto params = net->parameters();
  int active = 0;
  for (int r = 0; r < s.world(); ++r) active += t < s.steps[r];
  const float w = static_cast<float>(s.world());
  std::vector<at::Tensor> sum(params.size());
  for (int r = 0; r < s.world(); ++r) {
    std::vector<at::Tensor> wire(params.size());
    if (t < s.steps[r]) {
      opt.zero_grad();
      loss_of(net, batch_of(r)).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor g = params[i].grad().clone();
        if (active < s.world()) g.mul_(static_cast<double>(s.world()) / active);
        wire[i] = at::div(g, at::full({}, w)).to(at::kHalf);
      }
    } else {
      for (size_t i = 0; i < params.size(); ++i) wire[i] = at::zeros_like(params[i]).to(at::kHalf);
    }
    for (size_t i = 0; i < params.size(); ++i)
      sum[i] = r == 0 ? wire[i].to(at::kFloat) : (sum[i] + wire[i].to(at::kFloat));
  }
  for (size_t i = 0; i < params.size(); ++i)
    params[i].mutable_grad() = sum[i].to(at::kHalf).to(at::kFloat);
  opt.step();
}

struct Outcome {
  std::vector<std::vector<double>> params;  // per rank
  std::vector<double> shadowed;             // per rank: join()'s return
  std::vector<double> ref, init;
};

Outcome run(const Spec& s) {
  const std::string dir = make_temp_dir("distopt_join");
  const int world = s.world(), max_steps = s.max_steps();
  auto data = [&] {
    distopt::test::seed_cpu(kDataSeed);
    const int64_t n = static_cast<int64_t>(max_steps) * world * kBatch;
    return std::make_pair(at::randn({n, kIn}), at::randint(0, kClasses, {n}));
  };
  if (s.reference) {
    auto codes = fork_ranks(1, [&](int) {
      torch::set_num_threads(1);
      auto [x, y] = data();
      distopt::test::seed_cpu(kInitSeed);
      Mlp3 net(kIn, kClasses);
      write_doubles(dir + "/init.bin", flat_params(net));
      auto opt = reference_optimizer(s, net);
      for (int t = 0; t < max_steps; ++t) {
        if (s.fp16_wire) {
          fp16_reference_step(
              s, net, *opt, [&](int r) { return batch(x, y, world, t, r); }, t);
          continue;
        }
        opt->zero_grad();
        at::Tensor sum = at::zeros({});
        int active = 0;
        for (int r = 0; r < world; ++r)
          if (t < s.steps[r]) {
            sum = sum + loss_of(net, batch(x, y, world, t, r));
            ++active;
          }
        (sum / (s.divide_by_world ? world : active)).backward();
        opt->step();
      }
      write_doubles(dir + "/ref.bin", flat_params(net));
      return 0;
    });
    REQUIRE(codes[0] == 0);
  }
  std::ostringstream yaml;
  yaml << plugins_and_world_yaml(world, random_port()) << "communicator: {name: tcp}\n"
       << "reducer: " << s.reducer << "\nalgorithm: " << s.algorithm
       << "\noptimizer: " << optimizer_yaml(s) << "\n"
       << (s.extra_yaml.empty() ? "join: {enabled: true}\n" : s.extra_yaml);
  const std::string job = yaml.str();
  auto codes = fork_ranks(world, [&](int rank) {
    torch::set_num_threads(1);
    auto [x, y] = data();
    distopt::test::seed_cpu(kInitSeed);
    Mlp3 net(kIn, kClasses);
    if (s.bf16) net->to(at::kBFloat16);
    auto rt = rank_runtime(job, rank, world, "join.yaml");
    auto opt = rt.make_optimizer(*net);
    for (int t = 0; t < s.steps[rank]; ++t) {
      opt.zero_grad();
      auto b = batch(x, y, world, t, rank);
      if (s.bf16) b.first = b.first.to(at::kBFloat16);
      opt.scale_loss(loss_of(net, b)).backward();
      opt.step();
    }
    const int64_t shadowed = opt.join();
    auto v = flat_params(net);
    v.push_back(static_cast<double>(shadowed));
    write_doubles(dir + "/rank" + std::to_string(rank) + ".bin", v);
    rt.barrier();  // the communicator still works after join()
    return 0;
  });
  Outcome o;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    auto v = read_doubles(dir + "/rank" + std::to_string(r) + ".bin");
    REQUIRE(!v.empty());
    o.shadowed.push_back(v.back());
    v.pop_back();
    o.params.push_back(v);
  }
  if (s.reference) {
    o.ref = read_doubles(dir + "/ref.bin");
    o.init = read_doubles(dir + "/init.bin");
  }
  distopt::test::remove_tree(dir);
  return o;
}

void check(const Spec& s, double tol = 1e-5) {
  const Outcome o = run(s);
  for (int r = 0; r < s.world(); ++r) {
    CAPTURE(r);
    CHECK(o.shadowed[r] == s.max_steps() - s.steps[r]);
    CHECK(max_abs_diff(o.params[r], o.params[0]) == 0);  // identical on every rank
    for (double v : o.params[r]) REQUIRE(std::isfinite(v));
    if (s.reference) {
      const double d = max_abs_diff(o.params[r], o.ref);
      if (tol != 1e-5) MESSAGE("rank " << r << ": max |params - reference| = " << d);
      CHECK(d <= tol);
    }
  }
  if (s.reference) {
    CHECK(max_abs_diff(o.ref, o.init) > 1e-3);  // training really moved the parameters
  }
}

}  // namespace

TEST_CASE("allreduce, 2 ranks, step counts differing by 1 and by 10") {
  check(Spec({12, 11}));
  check(Spec({3, 13}));
}

TEST_CASE("allreduce, 3 ranks, differing by 1 and by 10, and 1 step against 11") {
  check(Spec({12, 11, 12}));
  check(Spec({3, 13, 8}, "{name: allreduce}", "{name: mean}", "adam"));
}

TEST_CASE("join.divide_by_initial_world_size: the average divides by the world size") {
  Spec s({4, 14, 9});
  s.extra_yaml = "join: {enabled: true, divide_by_initial_world_size: true}\n";
  s.divide_by_world = true;
  check(s);
}

TEST_CASE("zero: the joined rank still owns its shard and takes part in the parameter sync") {
  check(Spec({5, 15}, "{name: zero, options: {stage: 1}}", "{name: mean}", "adam"));
  check(Spec({12, 11, 2}, "{name: zero, options: {stage: 2}}"));
  check(Spec({2, 12, 7}, "{name: zero, options: {stage: 1, partition: contiguous}}", "{name: mean}",
             "adam"));
}

TEST_CASE("fused") { check(Spec({12, 2}, "{name: fused}", "{name: mean}", "adam")); }

TEST_CASE("every reducer: identical parameters on every rank after join") {
  for (const char* reducer :
       {"{name: powersgd, options: {rank: 2, start_iter: 2}}",
        "{name: topk, options: {ratio: 0.1}}", "{name: randomk, options: {ratio: 0.1}}",
        "{name: signsgd}", "{name: fp16}", "{name: bf16}"}) {
    CAPTURE(reducer);
    Spec s({6, 9, 3}, "{name: allreduce}", reducer);
    s.reference = false;
    check(s);
  }
}

TEST_CASE("bf16 mixed precision: joined ranks shadow the inf/NaN check in the same order") {
  Spec s({6, 9, 3});
  s.extra_yaml = "join: {enabled: true}\nprecision: {dtype: bf16}\n";
  s.bf16 = true;
  s.reference = false;
  check(s);
}

TEST_CASE("fp16 reducer: equal to a reference that rounds as the wire does") {
  // The reference rounds each rank's gradient to half and the pair's sum once,
  // as the reducer and the allreduce do (fp16_reference_step), so the only
  // difference left is none: any other rounding (bf16 on the wire, truncation,
  // summing before the division) moves the parameters by 1e-5 or more.
  Spec s({10, 4}, "{name: allreduce}", "{name: fp16}");
  s.fp16_wire = true;
  check(s, 1e-7);
}

TEST_CASE("join() without join.enabled (the default) is refused on every rank") {
  const int port = random_port();
  const std::string job = plugins_and_world_yaml(2, port) +
                          "communicator: {name: tcp}\noptimizer: {name: sgd, lr: 0.1}\n";
  auto codes = fork_ranks(2, [&](int rank) {
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, 2, "join.yaml");
    auto opt = rt.make_optimizer(*net);
    try {
      opt.join();
    } catch (const distopt::ConfigError& e) {
      return std::string(e.what()).find("join.enabled: false") != std::string::npos ? 0 : 3;
    }
    return 2;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("join() while a backward's buckets await step() is refused; after step() it works") {
  const std::string job = plugins_and_world_yaml(2, random_port()) +
                          "communicator: {name: tcp}\noptimizer: {name: sgd, lr: 0.1}\n"
                          "join: {enabled: true}\n";
  auto codes = fork_ranks(2, [&](int rank) {
    distopt::test::seed_cpu(kInitSeed);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, 2, "join.yaml");
    auto opt = rt.make_optimizer(*net);
    opt.zero_grad();
    loss_of(net, {at::randn({kBatch, kIn}), at::randint(0, kClasses, {kBatch})}).backward();
    int rc = 2;
    try {
      opt.join();
    } catch (const distopt::Error& e) {
      rc = std::string(e.what()).find("call step() first") != std::string::npos ? 0 : 3;
    }
    opt.step();
    return rc == 0 && opt.join() == 0 ? 0 : rc == 0 ? 4 : rc;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}
