// Switching algorithms during training (Bagua's ModelSwitchWrapper.switch_to;
// the job's `schedule:`), on 2-3 real ranks over tcp on loopback: the ranks
// agree on the parameters at every switch, the inner optimizer's state
// carries over (an exact schedule equals one algorithm throughout), the
// switch from decentralized starts from the replicas' mean, bytes
// per step are the new algorithm's, a checkpoint taken in a later phase
// resumes in it bitwise, and bad schedules or calls are refused.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "rank_steps.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10, kBatch = 8;

std::string job_yaml(int world, const std::string& rest) {
  std::ostringstream y;
  y << plugins_and_world_yaml(world, random_port()) << "communicator: {name: tcp}\n"
    << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
    << rest;
  return y.str();
}

// Per rank and step: the parameters, then bytes_sent, the plain-allreduce
// bytes, and the schedule phase, flattened as one record per step.
struct Trace {
  std::vector<std::vector<std::vector<double>>> params;  // [rank][step]
  std::vector<std::vector<double>> bytes, plain, phase;  // [rank][step]
};

Trace run_trace(int world, const std::string& rest, int steps) {
  const std::string dir = make_temp_dir("distopt_switch");
  const std::string job = job_yaml(world, rest);
  auto codes = fork_ranks(world, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, world, "switch.yaml");
    auto opt = rt.make_optimizer(*net);
    std::vector<double> out;
    for (int t = 0; t < steps; ++t) {
      random_batch_step(net, opt, rank, t);
      auto p = flat_params(net);
      out.insert(out.end(), p.begin(), p.end());
      out.push_back(static_cast<double>(opt.bytes_sent()));
      out.push_back(static_cast<double>(opt.bytes_sent_plain_allreduce()));
      out.push_back(opt.schedule_phase());
    }
    write_doubles(rank_file(dir, "trace", rank), out);
    return 0;
  });
  Trace tr;
  for (int r = 0; r < world; ++r) {
    REQUIRE(codes[r] == 0);
    const auto v = read_doubles(rank_file(dir, "trace", r));
    const size_t rec = v.size() / static_cast<size_t>(steps);
    tr.params.emplace_back();
    tr.bytes.emplace_back();
    tr.plain.emplace_back();
    tr.phase.emplace_back();
    for (int t = 0; t < steps; ++t) {
      const double* row = v.data() + t * rec;
      tr.params[r].emplace_back(row, row + rec - 3);
      tr.bytes[r].push_back(row[rec - 3]);
      tr.plain[r].push_back(row[rec - 2]);
      tr.phase[r].push_back(row[rec - 1]);
    }
  }
  distopt::test::remove_tree(dir);
  return tr;
}

const char* kThreePhases =
    "schedule:\n"
    "  - {until_step: 3, algorithm: {name: allreduce}}\n"
    "  - {until_step: 6, algorithm: {name: decentralized, options: {topology: ring}}}\n"
    "  - {algorithm: {name: zero}}\n";

}  // namespace

TEST_CASE("schedule: the ranks agree at every switch; bytes per step are the new algorithm's") {
  constexpr int kWorld = 3, kSteps = 9;
  const Trace tr = run_trace(kWorld, kThreePhases, kSteps);
  const double param_bytes = 4.0 * static_cast<double>(tr.params[0][0].size());
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    // Phase after step t (the switch happens at the end of the bounding step).
    const std::vector<double> want = {0, 0, 1, 1, 1, 2, 2, 2, 2};
    CHECK(tr.phase[r] == want);
    // Right after each switch every rank holds the same parameters, bitwise:
    // after step 3 (allreduce -> decentralized: allreduce kept them equal)
    // and after step 6 (decentralized -> zero: the replicas' mean).
    CHECK(max_abs_diff(tr.params[r][2], tr.params[0][2]) == 0);
    CHECK(max_abs_diff(tr.params[r][5], tr.params[0][5]) == 0);
    CHECK(max_abs_diff(tr.params[r][8], tr.params[0][8]) == 0);  // zero keeps them equal
    // Decentralized steps 4 and 5 (t = 3, 4) leave the replicas apart.
    if (r > 0) CHECK(max_abs_diff(tr.params[r][4], tr.params[0][4]) > 0);
    // Bytes: allreduce sends what a plain ring allreduce sends (mean
    // reducer); decentralized on a ring of 3 sends every parameter to 2
    // neighbours a step.
    const double plain_step = tr.plain[r][1] - tr.plain[r][0];
    CHECK(plain_step > 0);
    CHECK(tr.bytes[r][1] - tr.bytes[r][0] == plain_step);
    CHECK(tr.bytes[r][4] - tr.bytes[r][3] == 2 * param_bytes);
    // zero: its reduce-scatter and parameter allgather (not the gossip's 2x params).
    const double zero_step = tr.bytes[r][8] - tr.bytes[r][7];
    CHECK(zero_step != 2 * param_bytes);
    CHECK(zero_step > 0.5 * plain_step);
    CHECK(zero_step < 2 * plain_step);
  }
}

TEST_CASE("the switch from decentralized starts every rank from the mean of the replicas") {
  // The same steps without the switch at step 6 keep the replicas apart:
  // their mean is what every rank must hold right after the switch (rank
  // 0's replica, or any one rank's, would leave the ranks agreeing too).
  constexpr int kWorld = 3, kSteps = 6;
  const Trace switched = run_trace(kWorld, kThreePhases, kSteps);
  const Trace apart =
      run_trace(kWorld,
                "schedule:\n"
                "  - {until_step: 3, algorithm: {name: allreduce}}\n"
                "  - {algorithm: {name: decentralized, options: {topology: ring}}}\n",
                kSteps);
  constexpr int kAfterSwitch = 5;  // the trace index of step 6
  const size_t n = apart.params[0][kAfterSwitch].size();
  std::vector<double> mean(n, 0.0);
  for (int r = 0; r < kWorld; ++r)
    for (size_t i = 0; i < n; ++i) mean[i] += apart.params[r][kAfterSwitch][i] / kWorld;
  double spread = 0;  // how far the replicas are from their mean
  for (int r = 0; r < kWorld; ++r)
    spread = std::max(spread, max_abs_diff(apart.params[r][kAfterSwitch], mean));
  MESSAGE("replicas' distance from their mean before the switch: " << spread);
  REQUIRE(spread > 1e-4);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(switched.phase[r][kAfterSwitch] == 2);
    // One float32 allreduce and division against a float64 mean (measured:
    // 2e-8), where the replicas were 2e-2 apart.
    const double d = max_abs_diff(switched.params[r][kAfterSwitch], mean);
    MESSAGE("rank " << r << ": max |params after the switch - mean of the replicas| = " << d);
    CHECK(d <= 1e-6);
  }
}

TEST_CASE("an exact schedule equals one algorithm: the optimizer state carries over") {
  // allreduce -> zero -> allreduce with momentum: a lost momentum buffer at
  // either switch would change every later step.
  constexpr int kWorld = 2, kSteps = 8;
  const Trace plain = run_trace(kWorld, "algorithm: {name: allreduce}\n", kSteps);
  const Trace sched = run_trace(kWorld,
                                "schedule:\n"
                                "  - {until_step: 3}\n"
                                "  - {until_step: 5, algorithm: {name: zero}}\n"
                                "  - {reducer: {name: mean, options: {bucket_cap_mb: 0.001}}}\n",
                                kSteps);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(sched.phase[r].back() == 2);
    for (int t = 0; t < kSteps; ++t) {
      CAPTURE(t);
      CHECK(max_abs_diff(sched.params[r][t], plain.params[r][t]) <= 1e-6);
    }
  }
}

TEST_CASE("a checkpoint taken in phase 2 resumes in phase 2, every replica bitwise") {
  constexpr int kWorld = 3;
  const std::string dir = make_temp_dir("distopt_switch_ckpt");
  const std::string ckpt = dir + "/ckpt";
  const std::string job = job_yaml(kWorld,
                                   "schedule:\n"
                                   "  - {until_step: 2}\n"
                                   "  - {until_step: 20, algorithm: {name: decentralized}}\n"
                                   "  - {algorithm: {name: zero}}\n");
  auto run = [&](bool load, const std::string& tag) {
    auto codes = fork_ranks(kWorld, [&](int rank) {
      torch::set_num_threads(1);
      distopt::test::seed_cpu(7);
      Mlp3 net(kIn, kClasses);
      auto rt = rank_runtime(job, rank, kWorld, "ckpt.yaml");
      auto opt = rt.make_optimizer(*net);
      if (load) {
        rt.load_checkpoint(ckpt, *net, opt);
        if (opt.schedule_phase() != 1 || opt.algorithm_name() != "decentralized") return 3;
      } else {
        for (int t = 0; t < 5; ++t) random_batch_step(net, opt, rank, t);
        rt.save_checkpoint(ckpt, *net, opt);
      }
      for (int t = 5; t < 9; ++t) random_batch_step(net, opt, rank, t);
      write_doubles(rank_file(dir, tag, rank), flat_params(net));
      return 0;
    });
    for (int c : codes) REQUIRE(c == 0);
  };
  run(false, "straight");
  run(true, "resumed");
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const auto straight = read_doubles(rank_file(dir, "straight", r));
    CHECK(max_abs_diff(read_doubles(rank_file(dir, "resumed", r)), straight) == 0);
    if (r > 0) CHECK(max_abs_diff(straight, read_doubles(rank_file(dir, "straight", 0))) > 0);
  }
  // A job whose schedule has no phase 1 refuses the checkpoint on every rank.
  const std::string shorter = job_yaml(kWorld, "schedule:\n  - {algorithm: {name: zero}}\n");
  auto codes = fork_ranks(kWorld, [&](int rank) {
    torch::set_num_threads(1);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(shorter, rank, kWorld, "short.yaml");
    auto opt = rt.make_optimizer(*net);
    try {
      rt.load_checkpoint(ckpt, *net, opt);
    } catch (const distopt::CheckpointError& e) {
      const std::string msg = e.what();
      return msg.find("saved in schedule phase 1") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  for (int c : codes) CHECK(c == 0);
  distopt::test::remove_tree(dir);
}

TEST_CASE("switch_to: a bad call or ranks that disagree change nothing, on every rank") {
  constexpr int kWorld = 2;
  const std::string job = job_yaml(kWorld, "algorithm: {name: allreduce}\n");
  auto codes = fork_ranks(kWorld, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, kWorld, "bad.yaml");
    auto opt = rt.make_optimizer(*net);
    random_batch_step(net, opt, rank, 0);
    auto expect_config_error = [&](const distopt::ComponentConfig& a,
                                   const distopt::ComponentConfig& red, const std::string& what) {
      try {
        opt.switch_to(a, red);
      } catch (const distopt::ConfigError& e) {
        return std::string(e.what()).find(what) != std::string::npos;
      }
      return false;
    };
    distopt::ComponentConfig mean{"mean", {}, {}, {}};
    if (!expect_config_error({"no_such_algorithm", {}, {}, {}}, mean, "no_such_algorithm"))
      return 2;
    // The algorithm's own check refuses a compressing reducer.
    if (!expect_config_error({"decentralized", {}, {}, {}}, {"topk", {}, {}, {}}, "topk")) return 3;
    // Ranks asking for different options: refused on both.
    const std::string opts = rank == 0 ? "{topology: ring}" : "{topology: complete}";
    if (!expect_config_error({"decentralized", YAML::Load(opts), {}, {}}, mean,
                             "other components or options"))
      return 4;
    if (opt.algorithm_name() != "allreduce") return 5;
    // Between a backward and its step(): refused before any collective.
    opt.zero_grad();
    at::nll_loss(at::log_softmax(net->forward(at::randn({kBatch, kIn})), 1),
                 at::randint(0, kClasses, {kBatch}))
        .backward();
    try {
      opt.switch_to({"decentralized", {}, {}, {}}, mean);
      return 7;
    } catch (const distopt::ConfigError&) {
      return 8;
    } catch (const distopt::Error& e) {
      if (std::string(e.what()).find("call step() first") == std::string::npos) return 9;
    }
    opt.step();
    random_batch_step(net, opt, rank, 1);  // still works
    opt.switch_to({"decentralized", YAML::Load("{topology: ring}"), {}, {}}, mean);
    if (opt.algorithm_name() != "decentralized" || opt.schedule_phase() != -1) return 6;
    random_batch_step(net, opt, rank, 2);
    return 0;
  });
  for (int r = 0; r < kWorld; ++r) CHECK(codes[r] == 0);
}

TEST_CASE("bad schedules are refused naming the file, line and phase") {
  auto error_of = [](const std::string& yaml) -> std::string {
    try {
      distopt::parse_job_config(yaml, "sched.yaml");
    } catch (const distopt::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of("schedule:\n  - {until_step: 5}\n  - {until_epoch: 2}\n").find("sched.yaml:3:") !=
        std::string::npos);
  CHECK(error_of("schedule:\n  - {until_step: 5}\n  - {until_epoch: 2}\n")
            .find("last phase runs to the end") != std::string::npos);
  CHECK(error_of("schedule:\n  - {algorithm: {name: zero}}\n  - {}\n")
            .find("exactly one of until_epoch, until_step") != std::string::npos);
  CHECK(error_of("schedule:\n  - {until_step: 5}\n  - {until_step: 5}\n  - {}\n")
            .find("schedule[1].until_step: must be greater") != std::string::npos);
  CHECK(error_of("schedule:\n  - {until_step: 5, optimizer: {name: adam}}\n  - {}\n")
            .find("unknown key 'optimizer'") != std::string::npos);
  CHECK(error_of("schedule: {until_step: 5}\n").find("expected a list of phases") !=
        std::string::npos);
  CHECK(error_of("schedule:\n  - {until_step: 5}\n  - {algorithm: {name: zero}}\n").empty());
}

TEST_CASE("a phase a component refuses is refused at check time, naming the phase") {
  // Validation needs the plugins: through the registry, as `distopt check`.
  const std::string yaml = plugins_and_world_yaml(3, 29999) +
                           "schedule:\n"
                           "  - {until_epoch: 1}\n"
                           "  - algorithm: {name: decentralized, options: {topology: shift_one}}\n";
  const distopt::JobConfig cfg = distopt::parse_job_config(yaml, "phase.yaml");
  distopt::PluginRegistry reg;
  reg.discover(distopt::PluginRegistry::search_path(cfg.plugin_paths));
  std::string msg;
  try {
    distopt::validate_job(cfg, reg);
  } catch (const distopt::ConfigError& e) {
    msg = e.what();
  }
  MESSAGE(msg);
  CHECK(msg.find("phase.yaml:5:") != std::string::npos);
  CHECK(msg.find("shift_one") != std::string::npos);
  CHECK(msg.find("schedule[1]") != std::string::npos);
}
