// zero stage 3 (parameters sharded over units, distopt/sharded_unit.hpp)
// across real processes on loopback (tcp + mean + zero) ends equal to one
// process running the same libtorch optimizer on the global batch, for SGD
// and Adam at 2, 3 and 4 ranks, with units of uneven sizes, a nested unit, a
// parameter outside every unit, a unit unused in forward, a buffer, gradient
// accumulation and clipping; and between steps each rank holds none of a
// unit's full parameters or gradients, during a step at most the gathered
// units the prefetch allows. Pattern of zero_test.cpp: forked children do all
// torch work and write results to files.
#include <signal.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sharded_unit.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10;
constexpr uint64_t kInitSeed = 42, kDataSeed = 1234;

// Two layers in one unit (a block), with a buffer that counts its forwards.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    a = register_module("a", torch::nn::Linear(32, 24));
    b = register_module("b", torch::nn::Linear(24, 16));
    calls = register_buffer("calls", at::zeros({1}));
  }
  at::Tensor forward(const at::Tensor& x) {
    calls.add_(1);
    return at::relu(b->forward(at::tanh(a->forward(x))));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  at::Tensor calls;
};
TORCH_MODULE(Block);

// A unit holding a unit (fc1_inner) and a layer of its own (fc1_proj).
struct OuterImpl : torch::nn::Module {
  OuterImpl() {
    inner = register_module("inner", distopt::ShardedUnit(torch::nn::Linear(kIn, 40)));
    proj = register_module("proj", torch::nn::Linear(40, 32));
  }
  at::Tensor forward(const at::Tensor& x) { return at::relu(proj->forward(at::relu(inner(x)))); }
  distopt::ShardedUnit inner{nullptr};
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(Outer);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    unused = register_module("unused", distopt::ShardedUnit(torch::nn::Linear(4, 3)));
    outer = register_module("outer", distopt::ShardedUnit(Outer()));
    block = register_module("block", distopt::ShardedUnit(Block()));
    head = register_module("head", distopt::ShardedUnit(torch::nn::Linear(16, kClasses)));
    scale = register_parameter("scale", at::ones({kClasses}));  // in no unit: whole
  }
  at::Tensor forward(const at::Tensor& x) { return head(block(outer(x))) * scale; }
  distopt::ShardedUnit unused{nullptr}, outer{nullptr}, block{nullptr}, head{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

struct Spec {
  int world = 2;
  int batch = 8;
  int steps = 12;
  int micro = 1;  // micro-batches per step (no_sync for all but the last)
  std::string optimizer = "sgd";
  bool reshard = true;
  bool overlap = false;  // overlap_comm
  double clip = 0;
};

std::string optimizer_yaml(const Spec& s) {
  const std::string clip = s.clip > 0 ? ", grad_clip: " + std::to_string(s.clip) : "";
  return s.optimizer == "sgd" ? "{name: sgd, lr: 0.05, momentum: 0.9" + clip + "}"
                              : "{name: adam, lr: 0.01" + clip + "}";
}

std::unique_ptr<torch::optim::Optimizer> reference(const Spec& s, Net& net) {
  if (s.optimizer == "sgd")
    return std::make_unique<torch::optim::SGD>(net->parameters(),
                                               torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01));
}

at::Tensor loss_of(Net& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(at::log_softmax(net->forward(x), 1), y);
}

// Bytes of the sharded units' parameters (every parameter but `scale`).
int64_t unit_param_bytes(Net& net) {
  int64_t n = 0;
  for (const auto& np : net->named_parameters())
    if (np.key() != "scale") n += np.value().numel() * 4;
  return n;
}

struct Outcome {
  std::vector<std::vector<double>> params;  // per rank, gathered after the last step
  std::vector<std::vector<double>> memory;  // per rank: see the rank body
  std::vector<double> ref, init;
};

Outcome run_case(const Spec& s) {
  const std::string dir = make_temp_dir("distopt_zero3");
  const int64_t global = static_cast<int64_t>(s.world) * s.batch;
  auto data = [&] {
    distopt::test::seed_cpu(kDataSeed);
    return std::make_pair(at::randn({global * s.steps, kIn}),
                          at::randint(0, kClasses, {global * s.steps}));
  };
  auto ref_codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    auto [x, y] = data();
    distopt::test::seed_cpu(kInitSeed);
    Net net;
    write_doubles(dir + "/init.bin", flat_params(net));
    auto opt = reference(s, net);
    for (int step = 0; step < s.steps; ++step) {
      opt->zero_grad();
      auto xs = x.narrow(0, step * global, global), ys = y.narrow(0, step * global, global);
      // K micro-batches of the global batch, each loss scaled by 1/K.
      const int64_t part = global / s.micro;
      for (int k = 0; k < s.micro; ++k)
        (loss_of(net, xs.narrow(0, k * part, part), ys.narrow(0, k * part, part)) / s.micro)
            .backward();
      // distopt gives the unused unit a zero gradient (zero_algorithm.hpp).
      for (auto& p : net->unused->parameters()) p.mutable_grad() = at::zeros_like(p);
      if (s.clip > 0) torch::nn::utils::clip_grad_norm_(net->parameters(), s.clip);
      opt->step();
    }
    write_doubles(dir + "/ref.bin", flat_params(net));
    return 0;
  });
  REQUIRE(ref_codes[0] == 0);

  std::ostringstream yaml;
  yaml << plugins_and_world_yaml(s.world, random_port()) << "communicator: {name: tcp}\n"
       << "reducer: {name: mean}\n"
       << "algorithm: {name: zero, options: {stage: 3, reshard_after_forward: "
       << (s.reshard ? "true" : "false") << ", overlap_comm: " << (s.overlap ? "true" : "false")
       << "}}\n"
       << "optimizer: " << optimizer_yaml(s) << "\n";
  const std::string job = yaml.str();
  auto codes = fork_ranks(
      s.world,
      [&](int rank) {
        torch::set_num_threads(1);
        auto [x, y] = data();
        distopt::test::seed_cpu(kInitSeed + 7 * rank);  // rank 0's parameters are broadcast
        Net net;
        const int64_t full_bytes = unit_param_bytes(net);
        // Most unit bytes gathered at once under the prefetch policy:
        // outer holds outer.inner (both gathered while inner runs) and block
        // is prefetched meanwhile; each unit's buffer is padded to a multiple
        // of the world size and its entries aligned (64 bytes of slack each).
        const int64_t pair_bytes =
            (40 * kIn + 40 + 32 * 40 + 32 + 32 * 24 + 24 + 24 * 16 + 16) * 4 + 3 * 64;
        auto rt = rank_runtime(job, rank, s.world, "zero3.yaml");
        auto opt = rt.make_optimizer(*net);
        std::vector<double> mem;
        mem.push_back(opt.shards_parameters() ? 1 : 0);
        mem.push_back(static_cast<double>(opt.sharding_memory().units));
        double max_between = 0, max_peak = 0, grads_between = 0, params_between = 0, max_cached = 0,
               max_unit_grads = 0;
        for (int step = 0; step < s.steps; ++step) {
          opt.zero_grad();
          const int64_t part = s.batch / s.micro;
          for (int k = 0; k < s.micro; ++k) {
            // The reference's micro-batch k is rows [k x global / K, ...) of the
            // global batch; this rank's share of it is its own `part` rows there.
            const int64_t o = step * global + k * (global / s.micro) + rank * part;
            auto loss = loss_of(net, x.narrow(0, o, part), y.narrow(0, o, part)) / s.micro;
            if (k + 1 < s.micro) {
              auto guard = opt.no_sync();
              loss.backward();
            } else {
              loss.backward();
            }
          }
          opt.step();
          const auto m = opt.sharding_memory();
          max_between = std::max<double>(max_between, static_cast<double>(m.gathered));
          max_cached = std::max<double>(max_cached, static_cast<double>(m.cached));
          max_peak = std::max<double>(max_peak, static_cast<double>(m.peak_gathered));
          max_unit_grads = std::max<double>(max_unit_grads, static_cast<double>(m.peak_unit_grads));
          for (const auto& np : net->named_parameters()) {
            if (np.key() == "scale") continue;
            params_between += static_cast<double>(np.value().numel());
            if (np.value().grad().defined()) grads_between += 1;
          }
        }
        mem.push_back(max_between);
        mem.push_back(max_peak);
        mem.push_back(params_between);
        mem.push_back(grads_between);
        mem.push_back(static_cast<double>(full_bytes));
        mem.push_back(static_cast<double>(pair_bytes));
        mem.push_back(static_cast<double>(opt.state_bytes()));
        std::vector<double> v;
        {
          auto whole = opt.gather_params();
          v = flat_params(net);
        }
        mem.push_back(static_cast<double>(net->head->parameters()[0].numel()));  // freed again
        mem.push_back(net->block->named_buffers()[0].value().item<double>());
        mem.push_back(max_cached);
        mem.push_back(max_unit_grads);
        write_doubles(dir + "/rank" + std::to_string(rank) + ".bin", v);
        write_doubles(dir + "/mem" + std::to_string(rank) + ".bin", mem);
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(180));
  Outcome o;
  for (int r = 0; r < s.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    o.params.push_back(read_doubles(dir + "/rank" + std::to_string(r) + ".bin"));
    o.memory.push_back(read_doubles(dir + "/mem" + std::to_string(r) + ".bin"));
  }
  o.ref = read_doubles(dir + "/ref.bin");
  o.init = read_doubles(dir + "/init.bin");
  distopt::test::remove_tree(dir);
  return o;
}

void check(const Spec& s, const Outcome& o) {
  REQUIRE(!o.ref.empty());
  CHECK(max_abs_diff(o.ref, o.init) > 1e-3);  // training really moved the parameters
  for (int r = 0; r < s.world; ++r) {
    CAPTURE(r);
    REQUIRE(o.params[r].size() == o.ref.size());
    CHECK(max_abs_diff(o.params[r], o.ref) <= 2e-5);
    CHECK(max_abs_diff(o.params[r], o.params[0]) == 0);
    const auto& m = o.memory[r];
    REQUIRE(m.size() == 13);
    CHECK(m[0] == 1);  // the optimizer shards parameters
    CHECK(m[1] == 5);  // units: unused, outer, outer.inner, block, head
    CHECK(m[2] == 0);  // no unit's full parameters present between steps
    CHECK(m[3] > 0);   // but during the steps
    if (s.reshard) {
      CHECK(m[3] <= m[7]);  // at most the running units and the prefetched one
      CHECK(m[3] < m[6]);   // never the whole model
    } else {
      CHECK(m[3] <= m[6] + 5 * 64);  // the units stay from forward to backward
    }
    CHECK(m[4] == 0);                   // unit parameters are empty between steps
    CHECK(m[5] == 0);                   // and have no gradient
    CHECK(m[9] == 0);                   // empty again after gather_params' guard
    CHECK(m[10] == s.steps * s.micro);  // the block's buffer counted every forward
    // Freed blocks kept for reuse: some, at most 4 of the largest unit's
    // (outer's own layer, 32 x 40 + 32 floats, aligned, plus the pool's slack).
    CHECK(m[11] > 0);
    CHECK(m[11] <= 4 * ((32 * 40 + 32) * 4 + 2 * 64 + 256));
    // Units' full gradients at once (the largest bucket is outer's own layer,
    // 40 x 32 + 32 floats; block's is 32 x 24 + 24 + 24 x 16 + 16).
    const double largest = (40 * 32 + 32) * 4 + 2 * 64 + 256;
    if (s.micro > 1) {
      CHECK(m[12] > largest);  // no_sync keeps every unit's gradients until the last micro-batch
    } else if (s.overlap) {
      // block's reduce-scatter runs on through outer's backward
      CHECK(m[12] >= (40 * 32 + 32 + 32 * 24 + 24 + 24 * 16 + 16) * 4);
    } else {
      CHECK(m[12] > 0);
      CHECK(m[12] <= largest);  // one unit's at a time (finish_buckets, ABI 1.9)
    }
  }
}

}  // namespace

TEST_CASE("zero stage 3, SGD(momentum), 2 ranks") {
  Spec s;
  check(s, run_case(s));
}

TEST_CASE("zero stage 3, Adam, 2 ranks, overlap_comm: true") {
  Spec s;
  s.optimizer = "adam";
  s.overlap = true;
  check(s, run_case(s));
}

TEST_CASE("zero stage 3, Adam, 3 ranks, reshard_after_forward: false") {
  Spec s;
  s.world = 3;
  s.optimizer = "adam";
  s.reshard = false;
  check(s, run_case(s));
}

TEST_CASE("zero stage 3, Adam, 4 ranks, 2 micro-batches under no_sync, grad_clip") {
  Spec s;
  s.world = 4;
  s.optimizer = "adam";
  s.micro = 2;
  s.clip = 0.5;
  check(s, run_case(s));
}

namespace {

// One rank of a checkpoint run: `job` (algorithm and world), `resume_from`
// (empty: start fresh), then `steps` steps from global step `first`; writes
// the gathered parameters, and with `save_to` saves a checkpoint and writes
// what Runtime::consolidate returned for the model (rank 0).
int checkpoint_rank(const std::string& job, int rank, int world, int first, int steps,
                    const std::string& resume_from, const std::string& save_to,
                    const std::string& out) {
  torch::set_num_threads(1);
  const int64_t global = 48;  // the same global batch at 4, 3 and 1 ranks
  const int64_t batch = global / world;
  distopt::test::seed_cpu(kDataSeed);
  auto x = at::randn({global * 12, kIn});
  auto y = at::randint(0, kClasses, {global * 12});
  distopt::test::seed_cpu(kInitSeed);
  Net net;
  auto rt = rank_runtime(job, rank, world, "zero3_ckpt.yaml");
  auto opt = rt.make_optimizer(*net);
  if (!resume_from.empty()) rt.load_checkpoint(resume_from, *net, opt);
  std::vector<double> loaded;
  {
    auto whole = opt.gather_params();
    loaded = flat_params(net);
  }
  for (int step = first; step < first + steps; ++step) {
    opt.zero_grad();
    const int64_t off = step * global + rank * batch;
    loss_of(net, x.narrow(0, off, batch), y.narrow(0, off, batch)).backward();
    opt.step();
  }
  std::vector<double> v;
  {
    auto whole = opt.gather_params();
    v = flat_params(net);
  }
  if (!save_to.empty()) {
    rt.save_checkpoint(save_to, *net, opt);
    auto all = rt.consolidate(*net, opt, 0);
    if (rank == 0) {
      std::vector<double> c;
      for (const auto& np : net->named_parameters()) {
        at::Tensor t = all.at("model/" + np.key()).to(at::kDouble).contiguous().view(-1);
        c.insert(c.end(), t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
      }
      write_doubles(out + ".consolidated", c);
    }
  }
  if (rank == 0) {
    write_doubles(out, v);
    write_doubles(out + ".loaded", loaded);
  }
  rt.barrier();
  return 0;
}

std::string job_yaml(int world, const std::string& algorithm) {
  std::ostringstream yaml;
  yaml << plugins_and_world_yaml(world, random_port()) << "communicator: {name: tcp}\n"
       << "reducer: {name: mean}\nalgorithm: " << algorithm << "\n"
       << "optimizer: {name: adam, lr: 0.01}\n";
  return yaml.str();
}

}  // namespace

TEST_CASE(
    "zero stage 3 checkpoint at 4 ranks: consolidated, restored at 3 ranks (stage 2) and "
    "at 1 rank (allreduce), equal to the uninterrupted run") {
  const std::string dir = make_temp_dir("distopt_zero3_ckpt");
  const std::string stage3 = "{name: zero, options: {stage: 3}}";
  auto run = [&](int world, const std::string& alg, int first, int steps, const std::string& from,
                 const std::string& save, const std::string& out) {
    const std::string job = job_yaml(world, alg);
    auto codes = fork_ranks(
        world,
        [&](int rank) {
          return checkpoint_rank(job, rank, world, first, steps, from, save, dir + "/" + out);
        },
        std::chrono::seconds(180));
    for (int r = 0; r < world; ++r) REQUIRE(codes[r] == 0);
    return read_doubles(dir + "/" + out);
  };
  const auto whole = run(4, stage3, 0, 10, "", "", "whole");
  const auto half = run(4, stage3, 0, 5, "", dir + "/ckpt", "half");
  // Consolidated model = what the ranks held at the save.
  CHECK(read_doubles(dir + "/half.consolidated") == half);
  const auto at3 = run(3, "{name: zero, options: {stage: 2}}", 5, 5, dir + "/ckpt", "", "at3");
  CHECK(read_doubles(dir + "/at3.loaded") == half);  // restored bit for bit
  const auto at1 = run(1, "{name: allreduce}", 5, 5, dir + "/ckpt", "", "at1");
  CHECK(read_doubles(dir + "/at1.loaded") == half);
  // Continuing (Adam's moments and step counts restored) ends where the
  // uninterrupted run did, up to the reduction order of the gradient mean.
  CHECK(max_abs_diff(at3, whole) <= 2e-5);
  CHECK(max_abs_diff(at1, whole) <= 2e-5);
  CHECK(max_abs_diff(whole, half) > 1e-3);
  // And into stage 3 itself at 3 ranks: the shards come from the gathered units.
  const auto at3z3 = run(3, stage3, 5, 5, dir + "/ckpt", "", "at3z3");
  CHECK(read_doubles(dir + "/at3z3.loaded") == half);
  CHECK(max_abs_diff(at3z3, whole) <= 2e-5);
  distopt::test::remove_tree(dir);
}

namespace {

// Rank 2 of 3 dies by SIGKILL at step 3: before it (between steps: the
// others fail in the next forward's gather) or after its forward (mid-step:
// they fail in the backward's gathers and reduce-scatters).
void killed_rank_is_named(bool mid_step) {
  constexpr int kWorld = 3, kDead = 2;
  const std::string job = job_yaml(kWorld, "{name: zero, options: {stage: 3}}");
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(kDataSeed);
        auto x = at::randn({8, kIn});
        auto y = at::randint(0, kClasses, {8});
        Net net;
        auto rt = rank_runtime(job, rank, kWorld, "zero3_kill.yaml");
        auto opt = rt.make_optimizer(*net);
        try {
          for (int step = 0; step < 6; ++step) {
            const bool dies = rank == kDead && step == 3;
            if (dies && !mid_step) raise(SIGKILL);
            opt.zero_grad();
            auto loss = loss_of(net, x, y);
            if (dies) raise(SIGKILL);
            loss.backward();
            opt.step();
          }
        } catch (const std::exception& e) {
          const std::string what = e.what();
          if (what.find("rank " + std::to_string(kDead)) != std::string::npos) return 0;
          std::fprintf(stderr, "rank %d: the error names no dead rank: %s\n", rank, e.what());
          return 2;
        }
        return 1;  // all steps completed without the dead rank
      },
      std::chrono::seconds(120));
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  CHECK(codes[kDead] != 0);  // killed
}

}  // namespace

TEST_CASE("zero stage 3: a rank killed between steps is named by the others' next gather") {
  killed_rank_is_named(false);
}

TEST_CASE("zero stage 3: a rank killed mid-step (after its forward) is named in the backward") {
  killed_rank_is_named(true);
}

namespace {

// A forked rank's results: its gathered parameters and its probes.
void write_rank(const std::string& dir, int rank, const std::vector<double>& params,
                const std::vector<double>& probes) {
  write_doubles(dir + "/rank" + std::to_string(rank) + ".bin", params);
  write_doubles(dir + "/probes" + std::to_string(rank) + ".bin", probes);
}

// Every rank exited 0 and ended within 2e-5 of `ref`; returns each rank's
// probes (`probes` of them).
std::vector<std::vector<double>> check_ranks(const std::string& dir, const std::vector<int>& codes,
                                             const std::vector<double>& ref, size_t probes) {
  std::vector<std::vector<double>> out;
  for (size_t r = 0; r < codes.size(); ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    const auto v = read_doubles(dir + "/rank" + std::to_string(r) + ".bin");
    REQUIRE(v.size() == ref.size());
    CHECK(max_abs_diff(v, ref) <= 2e-5);
    out.push_back(read_doubles(dir + "/probes" + std::to_string(r) + ".bin"));
    REQUIRE(out.back().size() == probes);
  }
  return out;
}

}  // namespace

namespace {

// A linear layer over a weight it is given (tied) and a bias of its own.
struct TiedLinearImpl : torch::nn::Module {
  explicit TiedLinearImpl(const at::Tensor& w) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", at::zeros({w.size(0)}));
  }
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight, bias); }
  at::Tensor weight, bias;
};
TORCH_MODULE(TiedLinear);

// Two units inside a unit, sharing `v`: v belongs to the enclosing unit.
struct PairImpl : torch::nn::Module {
  explicit PairImpl(const at::Tensor& v) {
    p1 = register_module("p1", distopt::ShardedUnit(TiedLinear(v)));
    p2 = register_module("p2", distopt::ShardedUnit(TiedLinear(v)));
  }
  at::Tensor forward(const at::Tensor& x) { return p2(at::tanh(p1(x))); }
  distopt::ShardedUnit p1{nullptr}, p2{nullptr};
};
TORCH_MODULE(Pair);

// Units `a` and `b` share `w` and no unit encloses both: w stays whole.
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl() {
    at::Tensor w = at::randn({kIn, kIn}) * 0.2, v = at::randn({kIn, kIn}) * 0.2;
    a = register_module("a", distopt::ShardedUnit(TiedLinear(w)));
    pair = register_module("pair", distopt::ShardedUnit(Pair(v)));
    b = register_module("b", distopt::ShardedUnit(TiedLinear(w)));
    head = register_module("head", distopt::ShardedUnit(torch::nn::Linear(kIn, kClasses)));
  }
  at::Tensor forward(const at::Tensor& x) {
    return head(at::relu(b(at::tanh(pair(at::relu(a(x)))))));
  }
  distopt::ShardedUnit a{nullptr}, pair{nullptr}, b{nullptr}, head{nullptr};
};
TORCH_MODULE(TiedNet);

// Each distinct parameter once (libtorch's parameters() lists a tied one per name).
std::vector<at::Tensor> distinct_params(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.is_same(p);
    if (!seen) out.push_back(p);
  }
  return out;
}

// Per rank: the gathered parameters after `steps` Adam steps, then whether
// w and v were whole between steps (numel), written to `out`.
void tied_case(int world, const std::string& algorithm) {
  const std::string dir = make_temp_dir("distopt_zero3_tied");
  constexpr int kSteps = 8, kBatch = 6;
  const int64_t global = static_cast<int64_t>(world) * kBatch;
  auto data = [&] {
    distopt::test::seed_cpu(kDataSeed);
    return std::make_pair(at::randn({global * kSteps, kIn}),
                          at::randint(0, kClasses, {global * kSteps}));
  };
  auto loss = [](TiedNet& net, const at::Tensor& x, const at::Tensor& y) {
    return at::nll_loss(at::log_softmax(net->forward(x), 1), y);
  };
  auto ref_codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    auto [x, y] = data();
    distopt::test::seed_cpu(kInitSeed);
    TiedNet net;
    torch::optim::Adam opt(distinct_params(*net), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      loss(net, x.narrow(0, step * global, global), y.narrow(0, step * global, global)).backward();
      opt.step();
    }
    write_doubles(dir + "/ref.bin", flat_params(net));
    return 0;
  });
  REQUIRE(ref_codes[0] == 0);
  const std::string job = job_yaml(world, algorithm);
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        auto [x, y] = data();
        distopt::test::seed_cpu(kInitSeed);
        TiedNet net;
        auto rt = rank_runtime(job, rank, world, "zero3_tied.yaml");
        auto opt = rt.make_optimizer(*net);
        std::vector<double> numels;
        for (int step = 0; step < kSteps; ++step) {
          opt.zero_grad();
          const int64_t o = step * global + rank * kBatch;
          loss(net, x.narrow(0, o, kBatch), y.narrow(0, o, kBatch)).backward();
          opt.step();
        }
        numels.push_back(static_cast<double>(net->a->named_parameters()[0].value().numel()));
        numels.push_back(static_cast<double>(net->pair->named_parameters()[0].value().numel()));
        numels.push_back(static_cast<double>(net->a->named_parameters()[1].value().numel()));
        numels.push_back(opt.shards_parameters() ? 1 : 0);
        std::vector<double> v;
        {
          auto whole = opt.gather_params();
          v = flat_params(net);
        }
        write_rank(dir, rank, v, numels);
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(180));
  for (const auto& n : check_ranks(dir, codes, read_doubles(dir + "/ref.bin"), 4)) {
    if (n[3] == 1) {
      CHECK(n[0] == kIn * kIn);  // w, shared by units a and b: whole between steps
      CHECK(n[1] == 0);          // v, shared inside unit pair: pair's, sharded
      CHECK(n[2] == 0);          // a's own bias: sharded
    } else {
      CHECK(n[1] == kIn * kIn);
    }
  }
  distopt::test::remove_tree(dir);
}

}  // namespace

TEST_CASE("zero stage 3, tied weights (between sibling units, inside one unit), Adam, 3 ranks") {
  tied_case(3, "{name: zero, options: {stage: 3}}");
}

TEST_CASE("allreduce with tied weights steps each shared parameter once, 2 ranks") {
  tied_case(2, "{name: allreduce}");
}

TEST_CASE(
    "zero stage 3 rebuilt: switch_to allreduce and back, add_param_group, 2 ranks, equal to "
    "single-process SGD") {
  // Steps 0-3 stage 3, 4-7 allreduce, 8-13 stage 3 again; `extra` (used from
  // step 0, its gradient dropped) joins as a second group before step 6.
  constexpr int kWorld = 2, kSteps = 14, kAddAt = 6;
  constexpr int64_t kBatch = 8, kGlobal = kWorld * kBatch;
  const std::string dir = make_temp_dir("distopt_zero3_rebuild");
  auto data = [&] {
    distopt::test::seed_cpu(kDataSeed);
    return std::make_pair(at::randn({kGlobal * kSteps, kIn}),
                          at::randint(0, kClasses, {kGlobal * kSteps}));
  };
  auto loss = [](Net& net, const at::Tensor& extra, const at::Tensor& x, const at::Tensor& y) {
    return at::nll_loss(at::log_softmax(net->forward(x) + extra, 1), y);
  };
  auto ref_codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    auto [x, y] = data();
    distopt::test::seed_cpu(kInitSeed);
    Net net;
    at::Tensor extra = at::full({kClasses}, 0.1).requires_grad_(true);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      if (step == kAddAt)
        opt.add_param_group(torch::optim::OptimizerParamGroup(
            {extra}, std::make_unique<torch::optim::SGDOptions>(
                         torch::optim::SGDOptions(0.02).momentum(0.9))));
      opt.zero_grad();
      extra.mutable_grad() = at::Tensor();
      loss(net, extra, x.narrow(0, step * kGlobal, kGlobal), y.narrow(0, step * kGlobal, kGlobal))
          .backward();
      for (auto& p : net->unused->parameters()) p.mutable_grad() = at::zeros_like(p);
      if (step < kAddAt) extra.mutable_grad() = at::Tensor();
      opt.step();
    }
    auto v = flat_params(net);
    v.insert(v.end(), extra.data_ptr<float>(), extra.data_ptr<float>() + kClasses);
    write_doubles(dir + "/ref.bin", v);
    return 0;
  });
  REQUIRE(ref_codes[0] == 0);
  std::ostringstream yaml;
  yaml << plugins_and_world_yaml(kWorld, random_port()) << "communicator: {name: tcp}\n"
       << "reducer: {name: mean}\nalgorithm: {name: zero, options: {stage: 3}}\n"
       << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";
  const std::string job = yaml.str();
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        auto [x, y] = data();
        distopt::test::seed_cpu(kInitSeed);
        Net net;
        at::Tensor extra = at::full({kClasses}, 0.1).requires_grad_(true);
        auto rt = rank_runtime(job, rank, kWorld, "zero3_rebuild.yaml");
        auto opt = rt.make_optimizer(*net);
        std::vector<double> numels;  // head.weight's numel between steps, per phase
        const distopt::ComponentConfig mean{"mean", {}, {}, {}, nullptr};
        for (int step = 0; step < kSteps; ++step) {
          if (step == 4) {
            numels.push_back(static_cast<double>(net->head->parameters()[0].numel()));
            opt.switch_to({"allreduce", {}, {}, {}, nullptr}, mean);
            numels.push_back(static_cast<double>(net->head->parameters()[0].numel()));
          }
          if (step == kAddAt) opt.add_param_group({{"extra", extra}}, 0.02);
          if (step == 8) {
            opt.switch_to({"zero", YAML::Load("{stage: 3}"), {}, {}, nullptr}, mean);
            numels.push_back(static_cast<double>(net->head->parameters()[0].numel()));
          }
          opt.zero_grad();
          extra.mutable_grad() = at::Tensor();
          const int64_t o = step * kGlobal + rank * kBatch;
          loss(net, extra, x.narrow(0, o, kBatch), y.narrow(0, o, kBatch)).backward();
          if (step < kAddAt) extra.mutable_grad() = at::Tensor();
          opt.step();
        }
        numels.push_back(opt.shards_parameters() ? 1 : 0);
        std::vector<double> v;
        {
          auto whole = opt.gather_params();
          v = flat_params(net);
        }
        v.insert(v.end(), extra.data_ptr<float>(), extra.data_ptr<float>() + kClasses);
        write_rank(dir, rank, v, numels);
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(180));
  for (const auto& n : check_ranks(dir, codes, read_doubles(dir + "/ref.bin"), 4)) {
    CHECK(n[0] == 0);              // stage 3: sharded between steps
    CHECK(n[1] == 16 * kClasses);  // allreduce: whole after the switch
    CHECK(n[2] == 0);              // stage 3 again: sharded
    CHECK(n[3] == 1);
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("zero stage 3 refuses join, naming the file and the key") {
  // FSDP is not a torch.distributed.algorithms.Joinable either: a rank out
  // of data would have to shadow every unit's gathers (mixed precision is
  // stage3_precision_test.cpp's).
  auto codes = fork_ranks(1, [&](int) {
    int bad = 0;
    for (const auto& [extra, key] : std::vector<std::pair<std::string, std::string>>{
             {"join: {enabled: true}\n", "join.enabled"}}) {
      const std::string job = job_yaml(1, "{name: zero, options: {stage: 3}}") + extra;
      Net net;
      try {
        auto rt = rank_runtime(job, 0, 1, "zero3_refused.yaml");
        auto opt = rt.make_optimizer(*net);
        std::fprintf(stderr, "%s: not refused\n", key.c_str());
        ++bad;
      } catch (const distopt::ConfigError& e) {
        const std::string what = e.what();
        if (what.find("zero3_refused.yaml: " + key + ": ") == std::string::npos) {
          std::fprintf(stderr, "%s: %s\n", key.c_str(), e.what());
          ++bad;
        }
      }
    }
    return bad;
  });
  CHECK(codes[0] == 0);
}
