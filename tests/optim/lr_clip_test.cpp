// optimizer.lr_schedule and optimizer.grad_clip on real ranks over tcp on
// loopback: a 2-rank job equals a single-process libtorch run that sets the
// lr by hand / calls clip_grad_norm_ on the averaged gradient, for every
// algorithm with a global gradient (tiny buckets, so clipping per bucket or
// per shard would differ); per-rank clipping for decentralized / local_sgd;
// a resumed checkpoint continues the schedule bitwise.
//
// Forked children do all the torch work; results go through files.
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/lr_schedule.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sharded_unit.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;

constexpr int kIn = 12, kClasses = 5, kBatch = 8;
constexpr uint64_t kInitSeed = 7, kDataSeed = 99;

// Each layer a unit of parameter sharding (zero stage 3); the other
// algorithms see plain layers (a ShardedUnit only forwards then).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", distopt::ShardedUnit(torch::nn::Linear(kIn, 24)));
    fc2 = register_module("fc2", distopt::ShardedUnit(torch::nn::Linear(24, 16)));
    fc3 = register_module("fc3", distopt::ShardedUnit(torch::nn::Linear(16, kClasses)));
  }
  at::Tensor forward(const at::Tensor& x) { return fc3(at::relu(fc2(at::relu(fc1(x))))); }
  distopt::ShardedUnit fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

at::Tensor loss_of(Net& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(at::log_softmax(net->forward(x), 1), y);
}

struct Data {
  at::Tensor x, y;
};
Data make_data(int64_t n) {
  distopt::test::seed_cpu(kDataSeed);
  return {at::randn({n, kIn}) * 3, at::randint(0, kClasses, {n})};
}

std::vector<double> flat_params(Net& net) {
  std::vector<double> out;
  for (const auto& p : net->parameters()) {
    at::Tensor c = p.detach().to(at::kDouble).contiguous().view(-1);
    out.insert(out.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return out;
}

struct Job {
  std::string algorithm = "{name: allreduce}";
  std::string reducer = "{name: mean, options: {bucket_cap_mb: 0.0005}}";  // several buckets
  std::string optimizer_extra;  // more keys of `optimizer:`
  std::string sections;         // more top-level YAML (schedule:)
  int world = 2, steps = 12;
};

std::string job_yaml(const Job& j, int port) {
  std::ostringstream y;
  y << plugins_and_world_yaml(j.world, port) << "communicator: {name: tcp}\n"
    << "reducer: " << j.reducer << "\nalgorithm: " << j.algorithm << "\n"
    << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9" << j.optimizer_extra << "}\n"
    << j.sections;
  return y.str();
}

// The same cosine-with-warm-up written out independently of LrSchedule
// (Hugging Face's get_cosine_schedule_with_warmup).
double cosine_warmup_lr(int k, int warmup, int total, double base) {
  if (k < warmup) return base * k / warmup;
  const double x = static_cast<double>(k - warmup) / (total - warmup);
  return base * 0.5 * (1 + std::cos(3.14159265358979323846 * std::min(1.0, x)));
}

// Single process, the whole global batch each step: clip_grad_norm_ on the
// averaged gradient (clip > 0) and the lr of lr_at(step) set by hand.
std::vector<double> reference(const Job& j, double clip, const std::function<double(int)>& lr_at) {
  const std::string dir = make_temp_dir("distopt_lrclip_ref");
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    const int64_t global = int64_t(j.world) * kBatch;
    Data d = make_data(global * j.steps);
    distopt::test::seed_cpu(kInitSeed);
    Net net;
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int k = 0; k < j.steps; ++k) {
      opt.zero_grad();
      loss_of(net, d.x.narrow(0, k * global, global), d.y.narrow(0, k * global, global)).backward();
      if (clip > 0) torch::nn::utils::clip_grad_norm_(net->parameters(), clip);
      if (lr_at) opt.param_groups()[0].options().set_lr(lr_at(k));
      opt.step();
    }
    write_doubles(dir + "/ref.bin", flat_params(net));
    return 0;
  });
  REQUIRE(codes[0] == 0);
  auto out = read_doubles(dir + "/ref.bin");
  remove_tree(dir);
  return out;
}

struct RankOut {
  std::vector<double> params, lrs;  // lrs: opt.lr() before each step
  double clipped_steps = 0, grad_norm_steps = 0;
  bool sharded = false;  // the optimizer shards parameters (zero stage 3) at the end
};

// The job on j.world ranks; rank r trains on its slice of the global batch.
std::vector<RankOut> run_job(const Job& j) {
  const std::string dir = make_temp_dir("distopt_lrclip");
  const std::string yaml = job_yaml(j, random_port());
  auto codes = fork_ranks(
      j.world,
      [&](int rank) {
        torch::set_num_threads(1);
        const int64_t global = int64_t(j.world) * kBatch;
        Data d = make_data(global * j.steps);
        distopt::test::seed_cpu(kInitSeed + 3 * rank);  // rank 0's start is broadcast
        Net net;
        auto rt = rank_runtime(yaml, rank, j.world, "lrclip.yaml");
        auto opt = rt.make_optimizer(*net);
        std::vector<double> lrs;
        for (int k = 0; k < j.steps; ++k) {
          opt.zero_grad();
          const int64_t at = k * global + rank * kBatch;
          loss_of(net, d.x.narrow(0, at, kBatch), d.y.narrow(0, at, kBatch)).backward();
          lrs.push_back(opt.lr());
          opt.step();
        }
        auto m = distopt::metrics_snapshot();
        {
          auto whole = opt.gather_params();  // zero stage 3: the units whole
          write_doubles(rank_file(dir, "params", rank), flat_params(net));
        }
        write_doubles(rank_file(dir, "lrs", rank), lrs);
        write_doubles(
            rank_file(dir, "metrics", rank),
            {m["optimizer.grad_clipped_steps"], m["optimizer.grad_norm_steps"],
             static_cast<double>(opt.num_buckets()), opt.shards_parameters() ? 1.0 : 0.0});
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(240));
  std::vector<RankOut> out(j.world);
  for (int r = 0; r < j.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    out[r].params = read_doubles(rank_file(dir, "params", r));
    out[r].lrs = read_doubles(rank_file(dir, "lrs", r));
    auto m = read_doubles(rank_file(dir, "metrics", r));
    REQUIRE(m.size() == 4);
    out[r].clipped_steps = m[0];
    out[r].grad_norm_steps = m[1];
    out[r].sharded = m[3] == 1;
    CHECK(m[2] >= 3);  // the tiny bucket cap really made several buckets
  }
  remove_tree(dir);
  return out;
}

constexpr double kClip = 0.3;  // well below the first steps' norms (~1-3)

void check_clipped_equals_reference(const Job& j, bool sharded = false) {
  auto ranks = run_job(j);
  const auto ref = reference(j, kClip, nullptr);
  REQUIRE(!ref.empty());
  for (size_t r = 0; r < ranks.size(); ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(ranks[r].params, ref) <= 2e-5);
    CHECK(max_abs_diff(ranks[r].params, ranks[0].params) <= 1e-6);
    CHECK(ranks[r].grad_norm_steps == j.steps);
    CHECK(ranks[r].clipped_steps >= 1);  // clipping really happened
    CHECK(ranks[r].sharded == sharded);
  }
  // ...and clipping changed the result (else equality proves nothing)
  const auto unclipped = reference(j, 0, nullptr);
  CHECK(max_abs_diff(unclipped, ref) > 1e-3);
}

}  // namespace

TEST_CASE("grad_clip: allreduce (several buckets) equals clip_grad_norm_ on the mean gradient") {
  Job j;
  j.optimizer_extra = ", grad_clip: 0.3";
  check_clipped_equals_reference(j);
}

TEST_CASE("grad_clip: zero stages 1, 2 and 3 sum the shards' squares over the ranks") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    Job j;
    j.algorithm = "{name: zero, options: {stage: " + std::to_string(stage) + "}}";
    j.optimizer_extra = ", grad_clip: 0.3";
    check_clipped_equals_reference(j, stage == 3);
  }
}

TEST_CASE("grad_clip: fused, hybrid (offload 0.5, unsharded and sharded), hierarchical") {
  for (const std::string alg : {"{name: fused}", "{name: hybrid, options: {offload_fraction: 0.5}}",
                                "{name: hybrid, options: {offload_fraction: 0.5, shard: true}}"}) {
    CAPTURE(alg);
    Job j;
    j.algorithm = alg;
    j.optimizer_extra = ", grad_clip: 0.3";
    check_clipped_equals_reference(j);
  }
  Job h;
  h.reducer = "{name: hierarchical, options: {bucket_cap_mb: 0.0005}}";
  h.optimizer_extra = ", grad_clip: 0.3";
  check_clipped_equals_reference(h);
}

TEST_CASE("grad_clip: the deprecated allreduce option still clips the same") {
  Job j;
  j.algorithm = "{name: allreduce, options: {grad_clip: 0.3}}";
  check_clipped_equals_reference(j);
}

TEST_CASE("grad_clip: decentralized and local_sgd clip each rank's own gradient") {
  for (const std::string alg :
       {"{name: decentralized}", "{name: local_sgd, options: {period: 2}}"}) {
    CAPTURE(alg);
    Job j;
    j.algorithm = alg;
    j.optimizer_extra = ", grad_clip: 0.3";
    j.steps = 6;
    const std::string dir = make_temp_dir("distopt_lrclip_local");
    const std::string yaml = job_yaml(j, random_port());
    auto codes = fork_ranks(j.world, [&](int rank) {
      torch::set_num_threads(1);
      Data d = make_data(int64_t(j.world) * kBatch * j.steps);
      distopt::test::seed_cpu(kInitSeed);
      Net net;
      auto rt = rank_runtime(yaml, rank, j.world, "lrclip.yaml");
      auto opt = rt.make_optimizer(*net);
      std::vector<double> rows;  // per step: own norm before, norm after step()
      for (int k = 0; k < j.steps; ++k) {
        opt.zero_grad();
        const int64_t at = (k * j.world + rank) * kBatch;
        loss_of(net, d.x.narrow(0, at, kBatch), d.y.narrow(0, at, kBatch)).backward();
        auto norm = [&] {
          double s = 0;
          for (const auto& p : net->parameters())
            s += p.grad().to(at::kDouble).pow(2).sum().item<double>();
          return std::sqrt(s);
        };
        rows.push_back(norm());
        opt.step();
        rows.push_back(norm());  // the gradients (bucket views) were scaled in place
      }
      write_doubles(rank_file(dir, "rows", rank), rows);
      rt.barrier();
      return 0;
    });
    for (int r = 0; r < j.world; ++r) {
      CAPTURE(r);
      REQUIRE(codes[r] == 0);
      const auto rows = read_doubles(rank_file(dir, "rows", r));
      REQUIRE(rows.size() == size_t(2 * j.steps));
      int clipped = 0;
      for (int k = 0; k < j.steps; ++k) {
        CAPTURE(k);
        const double before = rows[2 * k], after = rows[2 * k + 1];
        // clip_grad_norm_'s formula on this rank's own gradient
        CHECK(after ==
              doctest::Approx(before * std::min(1.0, kClip / (before + 1e-6))).epsilon(1e-5));
        clipped += before > kClip ? 1 : 0;
      }
      CHECK(clipped >= 1);
    }
    remove_tree(dir);
  }
}

TEST_CASE("lr_schedule: cosine with warm-up on 2 ranks equals SGD with the lr set by hand") {
  Job j;
  j.optimizer_extra = ", lr_schedule: {kind: cosine, warmup_steps: 3, total_steps: 10}";
  auto ranks = run_job(j);
  const auto ref = reference(j, 0, [](int k) { return cosine_warmup_lr(k, 3, 10, 0.1); });
  for (size_t r = 0; r < ranks.size(); ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(ranks[r].params, ref) <= 2e-5);
    REQUIRE(ranks[r].lrs.size() == size_t(j.steps));
    for (int k = 0; k < j.steps; ++k) {
      CAPTURE(k);
      CHECK(ranks[r].lrs[k] == doctest::Approx(cosine_warmup_lr(k, 3, 10, 0.1)).epsilon(1e-12));
    }
  }
  // without the schedule the result differs (the test can fail)
  const auto plain = reference(j, 0, nullptr);
  CHECK(max_abs_diff(plain, ref) > 1e-3);
}

TEST_CASE("lr_schedule and grad_clip carry across a schedule: phase switch (allreduce -> zero)") {
  Job j;
  j.optimizer_extra = ", grad_clip: 0.3, lr_schedule: {kind: step, step_size: 3, gamma: 0.5}";
  j.sections =
      "schedule:\n  - until_step: 5\n    algorithm: {name: allreduce}\n"
      "  - algorithm: {name: zero, options: {stage: 2}}\n";
  auto ranks = run_job(j);
  auto lr_at = [](int k) { return 0.1 * std::pow(0.5, k / 3); };
  const auto ref = reference(j, kClip, lr_at);
  for (size_t r = 0; r < ranks.size(); ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(ranks[r].params, ref) <= 2e-5);
    CHECK(ranks[r].clipped_steps >= 1);
    REQUIRE(ranks[r].lrs.size() == size_t(j.steps));
    for (int k = 0; k < j.steps; ++k) CHECK(ranks[r].lrs[k] == doctest::Approx(lr_at(k)));
  }
}

TEST_CASE("lr_schedule and grad_clip through a phase switch from allreduce to zero stage 3") {
  Job j;
  j.optimizer_extra = ", grad_clip: 0.3, lr_schedule: {kind: step, step_size: 3, gamma: 0.5}";
  j.sections =
      "schedule:\n  - until_step: 5\n    algorithm: {name: allreduce}\n"
      "  - algorithm: {name: zero, options: {stage: 3}}\n";
  auto ranks = run_job(j);
  auto lr_at = [](int k) { return 0.1 * std::pow(0.5, k / 3); };
  const auto ref = reference(j, kClip, lr_at);
  for (size_t r = 0; r < ranks.size(); ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(ranks[r].params, ref) <= 2e-5);
    CHECK(ranks[r].clipped_steps >= 1);
    CHECK(ranks[r].sharded);  // the second phase shards the parameters
    REQUIRE(ranks[r].lrs.size() == size_t(j.steps));
    for (int k = 0; k < j.steps; ++k) CHECK(ranks[r].lrs[k] == doctest::Approx(lr_at(k)));
  }
}

TEST_CASE("lr_schedule: a resumed checkpoint continues the schedule bitwise (zero, with set_lr)") {
  Job j;
  j.algorithm = "{name: zero, options: {stage: 2}}";
  j.optimizer_extra = ", grad_clip: 0.3, lr_schedule: {kind: step, step_size: 2, gamma: 0.7}";
  j.steps = 10;
  const int half = 5;
  const std::string dir = make_temp_dir("distopt_lrclip_ckpt");
  // phase 0: uninterrupted; 1: steps [0, half) then save; 2: load, [half, steps)
  auto run = [&](int phase) {
    const std::string yaml = job_yaml(j, random_port());
    auto codes = fork_ranks(j.world, [&](int rank) {
      torch::set_num_threads(1);
      const int64_t global = int64_t(j.world) * kBatch;
      Data d = make_data(global * j.steps);
      distopt::test::seed_cpu(kInitSeed);
      Net net;
      auto rt = rank_runtime(yaml, rank, j.world, "lrclip.yaml");
      auto opt = rt.make_optimizer(*net);
      opt.set_lr(0.2);  // the user's base: the schedule scales it
      int from = 0, to = j.steps;
      if (phase == 1) to = half;
      if (phase == 2) {
        rt.load_checkpoint(dir + "/ckpt", *net, opt);
        from = static_cast<int>(opt.steps());
      }
      std::vector<double> lrs;
      for (int k = from; k < to; ++k) {
        opt.zero_grad();
        const int64_t at = k * global + rank * kBatch;
        loss_of(net, d.x.narrow(0, at, kBatch), d.y.narrow(0, at, kBatch)).backward();
        lrs.push_back(opt.lr());
        opt.step();
      }
      if (phase == 1) rt.save_checkpoint(dir + "/ckpt", *net, opt);
      write_doubles(rank_file(dir, "params" + std::to_string(phase), rank), flat_params(net));
      write_doubles(rank_file(dir, "lrs" + std::to_string(phase), rank), lrs);
      rt.barrier();
      return 0;
    });
    for (int r = 0; r < j.world; ++r) REQUIRE(codes[r] == 0);
  };
  run(0);
  run(1);
  run(2);
  for (int r = 0; r < j.world; ++r) {
    CAPTURE(r);
    const auto whole = read_doubles(rank_file(dir, "params0", r));
    const auto resumed = read_doubles(rank_file(dir, "params2", r));
    REQUIRE(!whole.empty());
    CHECK(whole == resumed);  // bitwise
    auto lrs = read_doubles(rank_file(dir, "lrs1", r));
    const auto rest = read_doubles(rank_file(dir, "lrs2", r));
    lrs.insert(lrs.end(), rest.begin(), rest.end());
    CHECK(lrs == read_doubles(rank_file(dir, "lrs0", r)));
    REQUIRE(lrs.size() == size_t(j.steps));
    for (int k = 0; k < j.steps; ++k)
      CHECK(lrs[k] == doctest::Approx(0.2 * std::pow(0.7, k / 2)).epsilon(1e-13));
  }
  remove_tree(dir);
}

TEST_CASE("lr_schedule: the embedding API refuses cosine without total_steps; set_lr_schedule") {
  Job j;
  j.world = 1;
  j.optimizer_extra = ", lr_schedule: cosine";
  const std::string dir = make_temp_dir("distopt_lrclip_api");
  const std::string yaml = job_yaml(j, random_port());
  Job ok = j;
  ok.optimizer_extra = "";
  const std::string yaml_ok = job_yaml(ok, random_port());
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    Net net;
    std::string msg;
    {
      auto rt = rank_runtime(yaml, 0, 1, "lrclip.yaml");
      try {
        rt.make_optimizer(*net);
      } catch (const distopt::ConfigError& e) {
        msg = e.what();
      }
    }
    auto rt = rank_runtime(yaml_ok, 0, 1, "lrclip.yaml");
    auto opt = rt.make_optimizer(*net);
    distopt::LrSchedule s;
    s.kind = distopt::LrScheduleKind::linear;
    s.total_steps = 4;
    s.end_factor = 0.5;
    opt.set_lr_schedule(s);
    std::vector<double> lrs;
    Data d = make_data(kBatch);
    for (int k = 0; k < 6; ++k) {
      lrs.push_back(opt.lr());
      opt.zero_grad();
      loss_of(net, d.x, d.y).backward();
      opt.step();
    }
    std::string bad;
    distopt::LrSchedule b;
    b.kind = distopt::LrScheduleKind::one_cycle;
    try {
      opt.set_lr_schedule(b);
    } catch (const distopt::ConfigError& e) {
      bad = e.what();
    }
    write_doubles(dir + "/lrs.bin", lrs);
    std::ofstream(dir + "/msg.txt") << msg << "\n" << bad << "\n";
    return 0;
  });
  REQUIRE(codes[0] == 0);
  const std::string msg = read_text(dir + "/msg.txt");
  CHECK(msg.find("lrclip.yaml: optimizer.lr_schedule.total_steps: required for kind 'cosine'") !=
        std::string::npos);
  CHECK(msg.find("optimizer.lr_schedule.total_steps: required for kind 'one_cycle'") !=
        std::string::npos);
  const auto lrs = read_doubles(dir + "/lrs.bin");
  const std::vector<double> want = {0.1, 0.0875, 0.075, 0.0625, 0.05, 0.05};
  REQUIRE(lrs.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) CHECK(lrs[k] == doctest::Approx(want[k]).epsilon(1e-13));
  remove_tree(dir);
}
