// DistributedOptimizer::add_param_group across real processes on loopback
// (tcp + mean + allreduce / zero / fused). The fine-tuning scenario: the last
// layer (fc3) starts frozen and outside the optimizer; after kAddAt steps it
// becomes trainable and is added as a new group with its own lr / weight
// decay. Every rank must end equal to one libtorch process doing the same on
// the global batch (torch::optim::X::add_param_group; kGlobalBatch samples
// per step, kGlobalBatch / W per rank, so the mean gradient is the same), and
// zero must partition the new parameters too (state per rank covers them).
// Pattern of tests/zero/zero_test.cpp: forked children do all torch work and
// write results to files.
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
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
constexpr int kGlobalBatch = 12;  // divisible by 2 and 3 ranks
constexpr int kSteps = 15, kAddAt = 5;
constexpr uint64_t kInitSeed = 42, kDataSeed = 1234;

using Net = Mlp3;  // kIn (20) -> 32 -> 16 -> kClasses (10)

constexpr double kBase = kIn * 32 + 32 + 32 * 16 + 16;  // fc1 + fc2 elements
constexpr double kLast = 16 * kClasses + kClasses;      // fc3 elements
constexpr double kLargest = kIn * 32;                   // fc1.weight

using Named = std::vector<std::pair<std::string, at::Tensor>>;
Named named(Net& net, bool last) {
  Named out;
  for (const auto& np : net->named_parameters())
    if ((np.key().rfind("fc3.", 0) == 0) == last) out.emplace_back(np.key(), np.value());
  return out;
}
std::vector<at::Tensor> tensors(const Named& n) {
  std::vector<at::Tensor> out;
  for (const auto& p : n) out.push_back(p.second);
  return out;
}
void set_trainable(const Named& n, bool on) {
  for (const auto& p : n) p.second.requires_grad_(on);
}
// Ranks other than 0 shift these parameters, so that only a broadcast from
// rank 0 (make_optimizer, add_param_group) makes them equal again.
void perturb_unless_rank0(int rank, const Named& n) {
  if (rank == 0) return;
  at::NoGradGuard no_grad;
  for (const auto& p : n) p.second.detach().add_(0.5);
}

// One case: the job, the inner optimizer and the new group's options.
struct Case {
  std::string algorithm = "zero";
  std::string options = "{}";
  int world = 2;
  std::string optimizer = "adam";  // adam | sgd (momentum 0.9) | sgd0 (plain) | adagrad
  double new_lr = 0.003, new_wd = -1;
  bool set_lr_early = false;  // set_lr(0.02, 0) after 3 steps: must survive the rebuild
  int add_at = kAddAt;        // -1: never add
};

std::string optimizer_yaml(const std::string& name) {
  if (name == "sgd") return "{name: sgd, lr: 0.05, momentum: 0.9}";
  if (name == "sgd0") return "{name: sgd, lr: 0.05}";
  if (name == "adagrad") return "{name: adagrad, lr: 0.05}";
  return "{name: adam, lr: 0.01}";
}

// Fresh options of the case's optimizer with the group's overrides.
template <class O>
std::unique_ptr<O> group_options(O o, double lr, double wd) {
  if (lr >= 0) o.lr(lr);
  if (wd >= 0) o.weight_decay(wd);
  return std::make_unique<O>(o);
}

std::unique_ptr<torch::optim::Optimizer> reference_optimizer(const Case& c,
                                                             const std::vector<at::Tensor>& p) {
  if (c.optimizer == "sgd")
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  if (c.optimizer == "sgd0")
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05));
  if (c.optimizer == "adagrad")
    return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.05));
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
}

// libtorch's add_param_group; Adagrad's needs its own optimizer (libtorch
// creates Adagrad state only in the constructor, and its step refuses a
// parameter without; a second optimizer over the new group is the same
// update: Adagrad is elementwise).
std::unique_ptr<torch::optim::Optimizer> reference_add(const Case& c, torch::optim::Optimizer& opt,
                                                       const std::vector<at::Tensor>& p) {
  if (c.optimizer == "adagrad")
    return std::make_unique<torch::optim::Adagrad>(
        p, *group_options(torch::optim::AdagradOptions(0.05), c.new_lr, c.new_wd));
  std::unique_ptr<torch::optim::OptimizerOptions> o;
  if (c.optimizer == "adam")
    o = group_options(torch::optim::AdamOptions(0.01), c.new_lr, c.new_wd);
  else if (c.optimizer == "sgd")
    o = group_options(torch::optim::SGDOptions(0.05).momentum(0.9), c.new_lr, c.new_wd);
  else
    o = group_options(torch::optim::SGDOptions(0.05), c.new_lr, c.new_wd);
  opt.add_param_group(torch::optim::OptimizerParamGroup(p, std::move(o)));
  return nullptr;
}

at::Tensor loss_of(Net& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(at::log_softmax(net->forward(x).to(at::kFloat), 1), y);
}

std::pair<at::Tensor, at::Tensor> data() {
  distopt::test::seed_cpu(kDataSeed);
  return {at::randn({kGlobalBatch * kSteps, kIn}),
          at::randint(0, kClasses, {kGlobalBatch * kSteps})};
}

// How every process (ranks and reference) starts: one intra-op thread, the
// global data (kDataSeed) into `x` / `y`, then the model drawn from kInitSeed.
Net seeded_model(at::Tensor& x, at::Tensor& y) {
  torch::set_num_threads(1);
  std::tie(x, y) = data();
  distopt::test::seed_cpu(kInitSeed);
  return Net();
}

// Rank `rank` of `world`'s slice of step `step`'s global batch in `t`
// (samples or labels): kGlobalBatch / world rows.
at::Tensor rank_slice(const at::Tensor& t, int step, int rank, int world) {
  const int batch = kGlobalBatch / world;
  return t.narrow(0, static_cast<int64_t>(step) * kGlobalBatch + rank * batch, batch);
}

std::string job_yaml(const Case& c, const std::string& precision = "") {
  std::ostringstream y;
  y << plugins_and_world_yaml(c.world, random_port()) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean}\n"
    << "algorithm: {name: " << c.algorithm << ", options: " << c.options << "}\n"
    << "optimizer: " << optimizer_yaml(c.optimizer) << "\n";
  if (!precision.empty()) y << "precision: " << precision << "\n";
  return y.str();
}

// Single-process libtorch on the global batch; returns the parameters after
// kSteps (and the initial ones in *init).
std::vector<double> reference(const Case& c, const TempDir& dir, std::vector<double>* init) {
  auto codes = fork_ranks(1, [&](int) {
    at::Tensor x, y;
    Net net = seeded_model(x, y);
    write_doubles(dir.file("init.bin"), flat_params(net));
    const Named last = named(net, true);
    set_trainable(last, false);
    auto opt = reference_optimizer(c, tensors(named(net, false)));
    std::unique_ptr<torch::optim::Optimizer> extra;
    for (int step = 0; step < kSteps; ++step) {
      if (c.set_lr_early && step == 3) opt->param_groups()[0].options().set_lr(0.02);
      if (step == c.add_at) {
        set_trainable(last, true);
        extra = reference_add(c, *opt, tensors(last));
      }
      opt->zero_grad();
      if (extra) extra->zero_grad();
      loss_of(net, rank_slice(x, step, 0, 1), rank_slice(y, step, 0, 1)).backward();
      opt->step();
      if (extra) extra->step();
    }
    write_doubles(dir.file("ref.bin"), flat_params(net));
    return 0;
  });
  REQUIRE(codes[0] == 0);
  if (init) *init = read_doubles(dir.file("init.bin"));
  return read_doubles(dir.file("ref.bin"));
}

struct RankResult {
  std::vector<double> params;
  double state_before = 0, state_after = 0;  // state_bytes() just before / at the end
  double sent_before = 0, sent_after = 0;    // bytes_sent()
  double groups = 0, steps = 0;
};

// The distributed run of `c`. The model is the same on every rank where it
// matters (fc3 is used in forward while frozen), but ranks other than 0
// shift fc1 / fc2 before make_optimizer and fc3 before add_param_group:
// their broadcasts must restore rank 0's values.
std::vector<RankResult> run(const Case& c, const TempDir& dir) {
  const std::string yaml = job_yaml(c);
  auto codes = fork_ranks(
      c.world,
      [&](int rank) {
        at::Tensor x, y;
        Net net = seeded_model(x, y);
        const Named last = named(net, true);
        set_trainable(last, false);
        auto rt = rank_runtime(yaml, rank, c.world);
        perturb_unless_rank0(rank, named(net, false));
        auto opt = rt.make_optimizer(named(net, false));
        std::vector<double> extra(4, 0.0);
        for (int step = 0; step < kSteps; ++step) {
          if (c.set_lr_early && step == 3) opt.set_lr(0.02, 0);
          if (step == c.add_at) {
            extra[0] = static_cast<double>(opt.state_bytes());
            extra[1] = static_cast<double>(opt.bytes_sent());
            set_trainable(last, true);
            perturb_unless_rank0(rank, last);
            opt.add_param_group(last, c.new_lr, c.new_wd);
          }
          opt.zero_grad();
          loss_of(net, rank_slice(x, step, rank, c.world), rank_slice(y, step, rank, c.world))
              .backward();
          opt.step();
        }
        extra[2] = static_cast<double>(opt.state_bytes());
        extra[3] = static_cast<double>(opt.bytes_sent());
        auto v = flat_params(net);
        v.insert(v.end(), extra.begin(), extra.end());
        v.push_back(opt.num_param_groups());
        v.push_back(static_cast<double>(opt.steps()));
        write_doubles(dir.file("rank" + std::to_string(rank) + ".bin"), v);
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(60));
  std::vector<RankResult> out;
  for (int r = 0; r < c.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    auto v = read_doubles(dir.file("rank" + std::to_string(r) + ".bin"));
    REQUIRE(v.size() > 6);
    RankResult res;
    res.steps = v.back();
    v.pop_back();
    res.groups = v.back();
    v.pop_back();
    res.sent_after = v.back();
    v.pop_back();
    res.state_after = v.back();
    v.pop_back();
    res.sent_before = v.back();
    v.pop_back();
    res.state_before = v.back();
    v.pop_back();
    res.params = std::move(v);
    out.push_back(std::move(res));
  }
  return out;
}

// Bytes of optimizer state per trainable element (state_bytes counts no steps).
double per_element(const std::string& optimizer) {
  if (optimizer == "adam") return 8;
  if (optimizer == "sgd" || optimizer == "adagrad") return 4;
  return 0;
}

// Run `c` and its reference; every rank equals libtorch (1e-5) and rank 0
// bitwise; returns the ranks' results for further checks.
std::vector<RankResult> run_and_compare(const Case& c) {
  TempDir dir("distopt_pg");
  std::vector<double> init;
  const auto ref = reference(c, dir, &init);
  REQUIRE(max_abs_diff(ref, init) > 1e-3);  // training moves them
  const auto res = run(c, dir);
  for (size_t r = 0; r < res.size(); ++r) {
    CAPTURE(r);
    const double d = max_abs_diff(res[r].params, ref);
    CAPTURE(d);
    if (r == 0)
      MESSAGE(c.algorithm << " " << c.options << " x" << c.world << " " << c.optimizer
                          << ": max |distopt - libtorch| = " << d);
    CHECK(d <= 1e-5);
    CHECK(max_abs_diff(res[r].params, res[0].params) == 0);
    CHECK(res[r].groups == (c.add_at >= 0 ? 2 : 1));
    CHECK(res[r].steps == kSteps);
  }
  return res;
}

// zero: before the add the state covers fc1 + fc2, after it fc3 too, each
// element on exactly one rank, and each rank holds about 1/W of it.
void check_zero_state(const Case& c, const std::vector<RankResult>& res, double tolerance_elems) {
  const double pe = per_element(c.optimizer);
  double before = 0, after = 0;
  for (const auto& r : res) {
    before += r.state_before;
    after += r.state_after;
  }
  CHECK(before == pe * kBase);
  CHECK(after == pe * (kBase + kLast));
  for (size_t r = 0; r < res.size(); ++r) {
    CAPTURE(r);
    const double share = after / c.world;
    CHECK(std::fabs(res[r].state_after - share) <= pe * tolerance_elems);
  }
}

// Whether f() throws E with every string of `want` in its message (else
// prints why, from rank `rank`).
template <class E, class F>
bool expect(int rank, const std::vector<std::string>& want, F f) {
  try {
    f();
  } catch (const E& e) {
    for (const auto& w : want)
      if (std::string(e.what()).find(w) == std::string::npos) {
        fprintf(stderr, "rank %d: '%s' lacks '%s'\n", rank, e.what(), w.c_str());
        return false;
      }
    return true;
  }
  fprintf(stderr, "rank %d: no exception (wanted '%s')\n", rank, want[0].c_str());
  return false;
}

}  // namespace

TEST_CASE("zero stage 1 greedy, Adam, fine-tuning: the frozen last layer added after 5 steps") {
  for (int world : {1, 2, 3}) {  // 1: the collectives short-cut
    CAPTURE(world);
    Case c;
    c.options = "{stage: 1, partition: greedy}";
    c.world = world;
    c.set_lr_early = true;
    auto res = run_and_compare(c);
    // Greedy assigns whole parameters: within one largest parameter of 1/W.
    check_zero_state(c, res, kLargest);
  }
}

TEST_CASE("zero stage 1 contiguous (bucket view), Adam, add_param_group with weight decay") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    Case c;
    c.options = "{stage: 1, partition: contiguous, parameters_as_bucket_view: true}";
    c.world = world;
    c.new_wd = 0.01;
    auto res = run_and_compare(c);
    check_zero_state(c, res, world);  // equal ranges, up to W - 1 elements of padding
  }
}

TEST_CASE("zero stage 2, Adam, add_param_group re-partitions the buckets") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    Case c;
    c.options = "{stage: 2}";
    c.world = world;
    auto res = run_and_compare(c);
    // Chunks of the (aligned) bucket: padding and alignment gaps are owned by nobody.
    check_zero_state(c, res, 2.0 * world + 8);
  }
}

TEST_CASE("zero stage 1 contiguous, Adagrad: the new group gets Adagrad's initial state") {
  Case c;
  c.options = "{stage: 1, partition: contiguous}";
  c.optimizer = "adagrad";
  c.new_lr = 0.02;
  auto res = run_and_compare(c);
  check_zero_state(c, res, c.world);
}

TEST_CASE("allreduce, SGD momentum: add_param_group with lr and weight decay; counters kept") {
  Case c;
  c.algorithm = "allreduce";
  c.optimizer = "sgd";
  c.new_lr = 0.02;
  c.new_wd = 0.01;
  c.set_lr_early = true;
  auto res = run_and_compare(c);
  for (const auto& r : res) {
    // Replicated state; bytes_sent continues across the rebuild.
    CHECK(r.state_before == 4 * kBase);
    CHECK(r.state_after == 4 * (kBase + kLast));
    CHECK(r.sent_before > 0);
    CHECK(r.sent_after > r.sent_before * (kSteps - 1) / kAddAt);
  }
}

TEST_CASE("fused, plain SGD: add_param_group with weight decay") {
  Case c;
  c.algorithm = "fused";
  c.optimizer = "sgd0";
  c.new_lr = 0.1;
  c.new_wd = 0.01;
  run_and_compare(c);
}

TEST_CASE("fused, Adam after steps: the new group starts its own step counter") {
  // fused keeps one step counter per param group: the added group's Adam
  // bias correction starts at step 1, as libtorch's fresh parameters do.
  for (int world : {2, 3}) {
    CAPTURE(world);
    Case c;
    c.algorithm = "fused";
    c.world = world;
    c.set_lr_early = true;
    run_and_compare(c);
  }
}

TEST_CASE("errors: duplicate names, ranks that disagree, a backward in flight") {
  Case c;
  c.algorithm = "allreduce";
  c.optimizer = "sgd";
  const std::string yaml = job_yaml(c);
  auto codes = fork_ranks(
      c.world,
      [&](int rank) {
        at::Tensor x, y;
        Net net = seeded_model(x, y);
        const Named last = named(net, true);
        set_trainable(last, false);
        auto rt = rank_runtime(yaml, rank, c.world);
        auto opt = rt.make_optimizer(named(net, false));
        auto one_step = [&](int step) {
          opt.zero_grad();
          loss_of(net, rank_slice(x, step, rank, c.world), rank_slice(y, step, rank, c.world))
              .backward();
        };
        one_step(0);
        opt.step();
        set_trainable(last, true);
        const at::Tensor w1 = net->fc1->weight, w3 = net->fc3->weight;
        if (!expect<distopt::ConfigError>(rank, {"'fc1.weight'", "already in the optimizer"}, [&] {
              opt.add_param_group({{"fc1.weight", w1}});
            }))
          return 2;
        if (!expect<distopt::ConfigError>(rank, {"'fc3.weight'", "named twice"}, [&] {
              opt.add_param_group({{"fc3.weight", w3}, {"fc3.weight", w3}});
            }))
          return 3;
        if (!expect<distopt::ConfigError>(rank, {"no parameters"},
                                          [&] { opt.add_param_group({}); }))
          return 4;
        // Only rank 1 passes another lr: both ranks must refuse, none hang.
        if (!expect<distopt::ConfigError>(rank, {"rank 1", "same call"}, [&] {
              opt.add_param_group(last, rank == 1 ? 0.5 : 0.1);
            }))
          return 5;
        // Between backward and step the buckets are being reduced.
        one_step(1);
        if (!expect<distopt::Error>(rank, {"call step() first"},
                                    [&] { opt.add_param_group(last); }))
          return 6;
        opt.step();
        // Nothing changed so far; a good call works after all that.
        if (opt.num_param_groups() != 1 || opt.steps() != 2) return 7;
        opt.add_param_group(last, 0.01);
        if (opt.num_param_groups() != 2 || opt.steps() != 2) return 8;
        one_step(2);
        opt.step();
        if (!expect<distopt::ConfigError>(
                rank, {"'fc3.bias'", "already in the optimizer (group 1)"}, [&] {
                  opt.add_param_group({{"fc3.bias", net->fc3->bias}});
                }))
          return 9;
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(60));
  for (int r = 0; r < c.world; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

TEST_CASE("bf16 mixed precision: fp32 masters and the loss scaler survive add_param_group") {
  // Run A has fc3 in the optimizer from the start as group 1 with lr 0 and
  // sets its lr at kAddAt; run B adds fc3 then (plain SGD: no state, so both
  // are the same updates). If B re-made its masters from the bf16 model,
  // fc1 / fc2 would lose their fp32 low bits; if it lost the scaler's growth
  // tracker, the scale would grow later (growth_interval 3).
  Case c;
  c.algorithm = "allreduce";
  c.optimizer = "sgd0";
  const std::string precision = "{dtype: bf16, growth_interval: 3}";
  TempDir dir("distopt_pg");
  for (int pass = 0; pass < 2; ++pass) {
    const bool add = pass == 1;
    const std::string yaml = job_yaml(c, precision);
    auto codes = fork_ranks(
        c.world,
        [&](int rank) {
          at::Tensor x, y;
          Net net = seeded_model(x, y);
          net->to(at::kBFloat16);
          const Named last = named(net, true);
          auto rt = rank_runtime(yaml, rank, c.world);
          distopt::ParamGroupSpec g1;
          for (const auto& p : last) g1.names.push_back(p.first);
          g1.lr = 0;
          set_trainable(last, !add);
          auto opt = add ? rt.make_optimizer(named(net, false))
                         : rt.make_optimizer(*net, {distopt::ParamGroupSpec{}, g1});
          std::vector<double> scales;
          for (int step = 0; step < kSteps; ++step) {
            if (step == kAddAt) {
              if (add) {
                set_trainable(last, true);
                perturb_unless_rank0(rank, last);
                opt.add_param_group(last, 0.003);
              } else {
                opt.set_lr(0.003, 1);
              }
            }
            opt.zero_grad();
            opt.scale_loss(loss_of(net, rank_slice(x, step, rank, c.world).to(at::kBFloat16),
                                   rank_slice(y, step, rank, c.world)))
                .backward();
            opt.step();
            scales.push_back(opt.loss_scale());
          }
          auto v = flat_params(net);
          v.insert(v.end(), scales.begin(), scales.end());
          write_doubles(dir.file((add ? "b" : "a") + std::to_string(rank) + ".bin"), v);
          rt.barrier();
          return 0;
        },
        std::chrono::seconds(60));
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      REQUIRE(codes[r] == 0);
    }
  }
  for (int r = 0; r < c.world; ++r) {
    CAPTURE(r);
    const auto a = read_doubles(dir.file("a" + std::to_string(r) + ".bin"));
    const auto b = read_doubles(dir.file("b" + std::to_string(r) + ".bin"));
    REQUIRE(a.size() == b.size());
    // The scale grew every 3 good steps in both runs: 65536 -> x2^5 after 15.
    CHECK(a.back() == 65536.0 * 32);
    CHECK(max_abs_diff(a, b) == 0);
  }
}
