// `local_sgd` checkpoints on real ranks: a checkpoint taken between two
// averages (replicas apart, momentum local) resumes every rank bitwise, and
// the step counter survives, so the warm-up does not run again and the
// averages fall on the same steps (pytorch/pytorch issue 74556); a
// checkpoint of 4 ranks loaded into 2 starts both from the replicas' mean
// and keeps the schedule.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/host_api.hpp"
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

constexpr int kIn = 20, kClasses = 10;
// Steps 0-2 warm up; local steps k = s - 2; averages after s = 6 and 10.
constexpr int kWarmup = 3, kSaveAt = 5;
const char* const kAlgorithm = "{name: local_sgd, options: {warmup_steps: 3, period: 4}}";

std::string file(const std::string& dir, const std::string& what, int r) {
  return dir + "/" + what + std::to_string(r) + ".bin";
}

// What a rank did after the checkpoint (saved or loaded): per step its
// parameters and the bytes sent in that step, then the step metrics.
struct After {
  std::vector<std::vector<double>> params;
  std::vector<double> bytes;
  double warmup_steps = 0, averages = 0;
};

After read_after(const std::string& path, int steps) {
  const auto v = read_doubles(path);
  REQUIRE(v.size() > 2);
  const size_t per_step = (v.size() - 2) / steps;
  After a;
  for (int t = 0; t < steps; ++t) {
    a.bytes.push_back(v[t * per_step]);
    a.params.emplace_back(v.begin() + t * per_step + 1, v.begin() + (t + 1) * per_step);
  }
  a.warmup_steps = v[v.size() - 2];
  a.averages = v.back();
  return a;
}

// `world` ranks train kSaveAt steps and save to `ckpt` (load: restore from
// it instead), then `after` more steps. Rank r writes <tag>_at<r> (its
// parameters at the checkpoint) and <tag><r> (read_after's layout).
void run(const std::string& dir, const std::string& ckpt, int world, bool load, int after,
         const std::string& tag) {
  std::ostringstream y;
  y << plugins_and_world_yaml(world, random_port()) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean}\nalgorithm: " << kAlgorithm
    << "\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";
  const std::string job = y.str();
  auto codes = fork_ranks(world, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, world, "ckpt.yaml");
    auto opt = rt.make_optimizer(*net);
    auto step = [&](int t) { random_batch_step(net, opt, rank, t); };
    if (load) {
      rt.load_checkpoint(ckpt, *net, opt);
    } else {
      for (int t = 0; t < kSaveAt; ++t) step(t);
      rt.save_checkpoint(ckpt, *net, opt);
    }
    write_doubles(file(dir, tag + "_at", rank), flat_params(net));
    distopt::metrics_reset();
    std::vector<double> out;
    for (int t = kSaveAt; t < kSaveAt + after; ++t) {
      const double before = static_cast<double>(opt.bytes_sent());
      step(t);
      out.push_back(static_cast<double>(opt.bytes_sent()) - before);
      const auto p = flat_params(net);
      out.insert(out.end(), p.begin(), p.end());
    }
    auto m = distopt::metrics_snapshot();
    out.push_back(m["local_sgd.warmup_steps"]);
    out.push_back(m["local_sgd.averages"]);
    write_doubles(file(dir, tag, rank), out);
    return 0;
  });
  for (int c : codes) REQUIRE(c == 0);
}

}  // namespace

TEST_CASE("checkpoint between averages: every rank resumes bitwise, the counter survives") {
  const std::string dir = make_temp_dir("distopt_lsgd_ckpt");
  const std::string ckpt = dir + "/ckpt";
  constexpr int kWorld = 4, kAfter = 7;  // steps 5..11: averages after 6 and 10
  run(dir, ckpt, kWorld, false, kAfter, "straight");
  run(dir, ckpt, kWorld, true, kAfter, "resumed");
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const auto at = read_doubles(file(dir, "straight_at", r));
    CHECK(max_abs_diff(read_doubles(file(dir, "resumed_at", r)), at) == 0);
    if (r > 0)  // saved between averages: the replicas differ
      CHECK(max_abs_diff(at, read_doubles(file(dir, "straight_at", 0))) > 1e-6);
    const After straight = read_after(file(dir, "straight", r), kAfter);
    const After resumed = read_after(file(dir, "resumed", r), kAfter);
    for (int t = 0; t < kAfter; ++t) {
      CAPTURE(kSaveAt + t);
      CHECK(max_abs_diff(resumed.params[t], straight.params[t]) == 0);
      CHECK(resumed.bytes[t] == straight.bytes[t]);
      // Only the averages after steps 6 and 10 send; no warm-up step again.
      const bool averaged = (kSaveAt + t - kWarmup + 1) % 4 == 0;
      if (averaged)
        CHECK(resumed.bytes[t] > 0);
      else
        CHECK(resumed.bytes[t] == 0);
    }
    CHECK(resumed.warmup_steps == 0);
    CHECK(resumed.averages == 2);
    CHECK(straight.averages == 2);
  }

  // 4 replicas -> 2 ranks: both start from their mean, and step 5 stays a
  // local step (no warm-up again), step 6 averages.
  std::vector<double> mean(read_doubles(file(dir, "straight_at", 0)).size(), 0.0);
  for (int r = 0; r < kWorld; ++r) {
    const auto v = read_doubles(file(dir, "straight_at", r));
    for (size_t i = 0; i < v.size(); ++i) mean[i] += v[i] / kWorld;
  }
  run(dir, ckpt, 2, true, 2, "two");
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(read_doubles(file(dir, "two_at", r)), mean) <= 1e-6);
    const After two = read_after(file(dir, "two", r), 2);
    CHECK(two.bytes[0] == 0);
    CHECK(two.bytes[1] > 0);
    CHECK(two.warmup_steps == 0);
    CHECK(two.averages == 1);
    CHECK(max_abs_diff(two.params[1], read_after(file(dir, "two", 0), 2).params[1]) == 0);
  }
  distopt::test::remove_tree(dir);
}
