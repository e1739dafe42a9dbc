// `decentralized` with low_precision: true (Bagua's LowPrecisionDecentralized,
// DCD-PSGD) on 2-4 real ranks (tcp on loopback): every rank's copy of a
// neighbour is bitwise that neighbour's own x_hat (read back from a
// consolidated checkpoint), gradient-free rounds drive the replicas to
// consensus while the mean moves no more than the quantization allows, a
// round sends about a quarter of the float32 gossip's bytes, a least-squares
// problem with different data per rank ends near its optimum, and
// checkpoints resume the copies bitwise (another world size starts them
// again from a float32 round).
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "decentralized_helpers.hpp"
#include "distopt/checkpoint.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common and decentralized helpers

constexpr int kIn = 20, kClasses = 10;
constexpr double kMlpParams = 20 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10;  // 1370
// One compressed message of the Mlp3 in one bucket: 2 chunks of (min, max)
// and a byte per element.
constexpr double kMessage = 2 * 8 + kMlpParams;

std::string low_precision(const std::string& options = "") {
  return "{name: decentralized, options: {low_precision: true" +
         (options.empty() ? "" : ", " + options) + "}}";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.scalar_type() == y.scalar_type() && x.numel() == y.numel() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Train `steps` steps on `world` ranks, save a checkpoint, consolidate it and
// compare every rank's copy of a neighbour with that neighbour's own x_hat.
// Returns how many copies were compared.
int compare_copies(int world, const std::string& algorithm, int steps,
                   const std::string& reducer_options = "{}") {
  CAPTURE(algorithm);
  const std::string dir = make_temp_dir("distopt_lpcopies");
  const std::string job =
      job_yaml(world, algorithm, "{name: sgd, lr: 0.05, momentum: 0.9}", reducer_options);
  auto codes = fork_ranks(world, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, world, "copies.yaml");
    auto opt = rt.make_optimizer(*net);
    for (int t = 0; t < steps; ++t) random_batch_step(net, opt, rank, t);
    rt.save_checkpoint(dir + "/ckpt", *net, opt);
    return 0;
  });
  for (int c : codes) REQUIRE(c == 0);
  distopt::consolidate_checkpoint(dir + "/ckpt", dir + "/all.pt");
  const std::string bytes = slurp(dir + "/all.pt");
  const auto state = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()))
                         .toGenericDict()
                         .at("state")
                         .toGenericDict();
  std::map<std::string, at::Tensor> entries;
  for (const auto& kv : state) entries[kv.key().toStringRef()] = kv.value().toTensor();
  // <prefix>low_precision/<bucket>/peer<j>@rank<r> against .../self@rank<j>
  const std::regex copy_key(R"((.*low_precision/\d+/)peer(\d+)@rank(\d+))");
  int compared = 0;
  std::map<std::string, int> selfs;
  for (const auto& [key, t] : entries) {
    std::smatch m;
    if (!std::regex_match(key, m, copy_key)) continue;
    const std::string own = m[1].str() + "self@rank" + m[2].str();
    CAPTURE(key);
    REQUIRE(entries.count(own) == 1);
    CHECK(same_bits(t, entries.at(own)));
    CHECK(m[2].str() != m[3].str());
    ++compared;
  }
  // The copies are not trivially equal: ranks 0 and 1 hold different x_hat.
  const std::string self0 = "algorithm/low_precision/0/self@rank0";
  INFO("keys: " << [&] {
    std::string k;
    for (const auto& e : entries) k += e.first + " ";
    return k;
  }());
  REQUIRE(entries.count(self0) == 1);
  CHECK_FALSE(same_bits(entries.at(self0), entries.at("algorithm/low_precision/0/self@rank1")));
  CHECK(entries.at(self0).abs().sum().item<double>() > 0);
  distopt::test::remove_tree(dir);
  return compared;
}

}  // namespace

TEST_CASE("every rank's copy of a neighbour is bitwise the neighbour's own x_hat") {
  // Ring of 4: 2 neighbours each, one bucket.
  CHECK(compare_copies(4, low_precision("topology: ring"), 7) == 4 * 2);
  // Ring of 2: the one neighbour.
  CHECK(compare_copies(2, low_precision(), 3) == 2);
  // Irregular graph (Metropolis-Hastings weights), local steps between
  // rounds, and an odd number of steps (the last one local).
  CHECK(compare_copies(4,
                       low_precision("topology: neighbors, neighbors: '0:1,2,3; 1:0; 2:0,3; "
                                     "3:0,2', communication_interval: 2"),
                       5) == 3 + 1 + 2 + 2);
  // Exponential graph on 4 (every other rank), many small buckets with
  // padding between entries: one tag per bucket on the wire.
  const int n = compare_copies(4, low_precision("topology: exponential"), 4,
                               "{bucket_cap_mb: 0.001, align_bytes: 64}");
  CHECK(n > 4 * 3);
  CHECK(n % (4 * 3) == 0);
  // The same with one message per link direction at a time (the schedule
  // ranks on several hosts get; these share one), over a ring's two links.
  const int m = compare_copies(4, low_precision("topology: ring, link_schedule: one_at_a_time"), 4,
                               "{bucket_cap_mb: 0.001, align_bytes: 64}");
  CHECK(m > 4 * 2);
  CHECK(m % (4 * 2) == 0);
}

namespace {

// Gradient-free rounds from different replicas: every rank writes its
// parameters before the first round and after each.
std::vector<std::vector<std::vector<double>>> gradient_free_rounds(int world,
                                                                   const std::string& algorithm,
                                                                   int rounds) {
  const std::string dir = make_temp_dir("distopt_lpconsensus");
  const std::string job = job_yaml(world, algorithm, "{name: sgd, lr: 0.1}");
  auto codes = fork_ranks(world, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, world, "consensus.yaml");
    auto opt = rt.make_optimizer(*net);
    scatter_replicas(net, rank);
    std::vector<double> log = flat_params(net);
    for (int t = 0; t < rounds; ++t) {
      opt.zero_grad();  // zero gradients: only the exchange moves the replica
      opt.step();
      const auto p = flat_params(net);
      log.insert(log.end(), p.begin(), p.end());
    }
    write_doubles(rank_file(dir, "log", rank), log);
    return 0;
  });
  for (int c : codes) REQUIRE(c == 0);
  std::vector<std::vector<std::vector<double>>> out(rounds + 1);  // [round][rank][element]
  for (int r = 0; r < world; ++r) {
    const auto log = read_doubles(rank_file(dir, "log", r));
    const size_t n = log.size() / (rounds + 1);
    for (int t = 0; t <= rounds; ++t)
      out[t].emplace_back(log.begin() + t * n, log.begin() + (t + 1) * n);
  }
  distopt::test::remove_tree(dir);
  return out;
}

}  // namespace

TEST_CASE("gradient-free rounds: consensus, and the mean moves only by the quantization") {
  constexpr int kWorld = 4, kRounds = 40;
  const auto x = gradient_free_rounds(kWorld, low_precision("topology: ring"), kRounds);
  const size_t n = x[0][0].size();
  std::vector<double> distance, spread;
  std::vector<std::vector<double>> mean;
  for (const auto& ranks : x) {
    std::vector<double> m(n, 0.0);
    double s = 0, d = 0;
    for (size_t e = 0; e < n; ++e) {
      double lo = ranks[0][e], hi = lo;
      for (const auto& xr : ranks) {
        m[e] += xr[e] / kWorld;
        lo = std::min(lo, xr[e]);
        hi = std::max(hi, xr[e]);
      }
      s = std::max(s, hi - lo);
      for (const auto& xr : ranks) d += (xr[e] - m[e]) * (xr[e] - m[e]) / kWorld;
    }
    mean.push_back(m);
    spread.push_back(s);
    distance.push_back(d);
  }
  REQUIRE(distance[0] > 100.0);  // the replicas start apart
  for (int t = 1; t <= kRounds; ++t) {
    CAPTURE(t);
    // z_i = sum_j W_ij x_j - x_i lies within the spread S of the replicas,
    // so a chunk's range is at most 2 S and each element's error at most
    // S / 255: the mean moves by no more (float32 rounding aside).
    CHECK(max_abs_diff(mean[t], mean[t - 1]) <= spread[t - 1] / 255 * 1.0001 + 1e-6);
  }
  MESSAGE("consensus distance: " << distance[0] << " -> " << distance[10] << " (10 rounds) -> "
                                 << distance[kRounds] << " (" << kRounds << "), mean moved "
                                 << max_abs_diff(mean[kRounds], mean[0]) << ", spread " << spread[0]
                                 << " -> " << spread[kRounds]);
  // The quantization error shrinks with the differences, so the replicas
  // converge (a float32 ring of 4 contracts by 1/3 per round).
  CHECK(distance[10] <= 1e-3 * distance[0]);
  CHECK(distance[kRounds] <= 1e-9 * distance[0]);
}

namespace {

struct Bytes {
  std::vector<double> per_rank;
};

Bytes train_bytes(int world, const std::string& algorithm, int steps) {
  const std::string dir = make_temp_dir("distopt_lpbytes");
  const std::string job = job_yaml(world, algorithm);
  auto codes = fork_ranks(world, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, world, "bytes.yaml");
    auto opt = rt.make_optimizer(*net);
    for (int t = 0; t < steps; ++t) random_batch_step(net, opt, rank, t);
    write_doubles(rank_file(dir, "bytes", rank), {static_cast<double>(opt.bytes_sent())});
    return 0;
  });
  Bytes out;
  for (int r = 0; r < world; ++r) {
    REQUIRE(codes[r] == 0);
    out.per_rank.push_back(read_doubles(rank_file(dir, "bytes", r))[0]);
  }
  distopt::test::remove_tree(dir);
  return out;
}

}  // namespace

TEST_CASE("bytes: a compressed round is about a quarter of the float32 gossip's") {
  const double fp32_round = 2 * 4 * kMlpParams;  // ring of 3: 2 neighbours
  const Bytes plain = train_bytes(3, "{name: decentralized}", 8);
  const Bytes low = train_bytes(3, low_precision(), 8);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(plain.per_rank[r] == 8 * fp32_round);
    // One float32 round to start the copies, then 8 compressed ones.
    CHECK(low.per_rank[r] == fp32_round + 8 * 2 * kMessage);
  }
  const double ratio = 2 * kMessage / fp32_round;
  MESSAGE("compressed / float32 bytes per round: " << ratio << " (8 steps in all: "
                                                   << low.per_rank[0] / plain.per_rank[0] << ")");
  CHECK(ratio < 0.26);
  // Every 3rd step (steps 0, 3, 6): the starting round and 3 compressed.
  const Bytes every3 = train_bytes(3, low_precision("communication_interval: 3"), 8);
  CHECK(every3.per_rank[2] == fp32_round + 3 * 2 * kMessage);
}

TEST_CASE("least squares with different data per rank: low precision ends near the optimum") {
  const std::string dir = make_temp_dir("distopt_lplsq");
  const std::vector<double> opt = LeastSquares::optimum();
  auto full = LeastSquares::run("{name: decentralized, options: {topology: ring}}", dir, "ring");
  auto low = LeastSquares::run(low_precision("topology: ring"), dir, "low");
  REQUIRE(!full.empty());
  REQUIRE(!low.empty());
  const double consensus = low.back();
  low.pop_back();
  full.pop_back();
  const double scale = LeastSquares::norm(opt);
  MESSAGE("|x*| = " << scale << ", |ring mean - x*| = " << max_abs_diff(full, opt)
                    << ", |low precision mean - x*| = " << max_abs_diff(low, opt) << ", consensus "
                    << consensus);
  // The same tolerance as the float32 ring: DCD-PSGD's fixed point is within
  // O(lr) of x*, and the compression error shrinks with the differences.
  CHECK(max_abs_diff(low, opt) <= 1e-2 * scale);
  CHECK(consensus <= 1e-2 * scale * scale);
}

TEST_CASE("checkpoints: copies resume bitwise; another layout or world size starts them again") {
  const std::string dir = make_temp_dir("distopt_lpckpt");
  const std::string ckpt = dir + "/ckpt";
  // communication_interval 2 and a save after 6 steps (the last one local):
  // x_i differs from x_hat_i, so copies started again from x_i would change
  // the run.
  const std::string algorithm = low_precision("communication_interval: 2");
  auto run = [&](int world, bool load, int before, int after, const std::string& tag,
                 const std::string& reducer_options = "{}", const std::string& other = "") {
    const std::string& alg = other.empty() ? algorithm : other;
    const std::string job =
        job_yaml(world, alg, "{name: sgd, lr: 0.05, momentum: 0.9}", reducer_options);
    auto codes = fork_ranks(world, [&](int rank) {
      torch::set_num_threads(1);
      distopt::test::seed_cpu(7);
      Mlp3 net(kIn, kClasses);
      auto rt = rank_runtime(job, rank, world, "ckpt.yaml");
      auto opt = rt.make_optimizer(*net);
      if (load) {
        rt.load_checkpoint(ckpt, *net, opt);
        write_doubles(rank_file(dir, tag + "_loaded", rank), flat_params(net));
      } else {
        scatter_replicas(net, rank);
        for (int t = 0; t < before; ++t) random_batch_step(net, opt, rank, t);
        write_doubles(rank_file(dir, tag + "_saved", rank), flat_params(net));
        rt.save_checkpoint(ckpt, *net, opt);
      }
      const uint64_t at_start = opt.bytes_sent();
      for (int t = before; t < before + after; ++t) random_batch_step(net, opt, rank, t);
      auto v = flat_params(net);
      v.push_back(static_cast<double>(opt.bytes_sent() - at_start));
      write_doubles(rank_file(dir, tag, rank), v);
      return 0;
    });
    for (int c : codes) REQUIRE(c == 0);
  };
  run(4, false, 6, 4, "straight");
  run(4, true, 6, 4, "resumed");
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    auto straight = read_doubles(rank_file(dir, "straight", r));
    auto resumed = read_doubles(rank_file(dir, "resumed", r));
    CHECK(straight.back() == 2 * 2 * kMessage);
    // Steps 6 and 8 communicate: 2 compressed rounds, no float32 one (and
    // the ranks agree on that: an allreduce of one float, 2 x 3/4 x 4 bytes).
    CHECK(resumed.back() == 2 * 2 * kMessage + 6);
    CHECK(max_abs_diff(read_doubles(rank_file(dir, "resumed_loaded", r)),
                       read_doubles(rank_file(dir, "straight_saved", r))) == 0);
    straight.pop_back();  // the bytes
    resumed.pop_back();
    CHECK(max_abs_diff(resumed, straight) == 0);
  }
  // Another bucket layout (a bucket per parameter or so): the copies start
  // again from a float32 round (at least 2 neighbours x the model in float32).
  run(4, true, 6, 4, "rebucketed", "{bucket_cap_mb: 0.001}");
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(read_doubles(rank_file(dir, "rebucketed", r)).back() > 2 * 4 * kMlpParams);
    CHECK(max_abs_diff(read_doubles(rank_file(dir, "rebucketed_loaded", r)),
                       read_doubles(rank_file(dir, "straight_saved", r))) == 0);
  }
  // Another graph: ranks 0 and 2 gain a neighbour whose copy was not saved,
  // ranks 1 and 3 have theirs; all must start again together (a float32
  // round: 4 bytes x the model per neighbour), or the exchange would not match.
  const std::string irregular = low_precision(
      "topology: neighbors, neighbors: '0:1,2,3; 1:0; 2:0,3; 3:0,2', communication_interval: 2");
  run(4, true, 6, 4, "regraphed", "{}", irregular);
  const int degree[] = {3, 1, 2, 2};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(read_doubles(rank_file(dir, "regraphed", r)).back() ==
          degree[r] * (4 * kMlpParams + 2 * kMessage) + 6);
  }
  // 4 replicas -> 2 ranks: both start from the mean, and the copies start
  // again from a float32 round (ring of 2: one neighbour).
  std::vector<double> mean(read_doubles(rank_file(dir, "straight_saved", 0)).size(), 0.0);
  for (int r = 0; r < 4; ++r) {
    const auto v = read_doubles(rank_file(dir, "straight_saved", r));
    for (size_t i = 0; i < v.size(); ++i) mean[i] += v[i] / 4;
  }
  run(2, true, 6, 3, "two");
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(read_doubles(rank_file(dir, "two_loaded", r)), mean) <= 1e-6);
    CHECK(read_doubles(rank_file(dir, "two", r)).back() == 4 * kMlpParams + 2 * kMessage + 4);
  }
  distopt::test::remove_tree(dir);
}

// The device path on CPU tensors: `kernels: torch` runs low_precision's
// codec on libtorch ops (what a CUDA job runs); it writes and reads the same
// bytes as the host codec, so a job ends bitwise equal with either, and a
// checkpoint of one resumes bitwise in the other.
TEST_CASE("kernels torch (the device codec) trains bitwise as the host codec; checkpoints cross") {
  const std::string dir = make_temp_dir("distopt_lpkernels");
  const std::string ckpt = dir + "/ckpt";
  // Exponential graph on 4, small buckets with padding (chunks cut short),
  // a local step between rounds.
  auto algorithm = [](const std::string& kernels) {
    return low_precision("topology: exponential, communication_interval: 2, kernels: " + kernels);
  };
  // Every rank trains steps [first, last) from its own replica (or the
  // checkpoint), optionally saves, and writes its parameters under `tag`.
  auto run = [&](const std::string& kernels, int first, int last, bool load, bool save,
                 const std::string& tag) {
    const std::string job = job_yaml(4, algorithm(kernels), "{name: sgd, lr: 0.05, momentum: 0.9}",
                                     "{bucket_cap_mb: 0.002, align_bytes: 64}");
    auto codes = fork_ranks(4, [&](int rank) {
      torch::set_num_threads(1);
      distopt::test::seed_cpu(7);
      Mlp3 net(kIn, kClasses);
      auto rt = rank_runtime(job, rank, 4, "kernels.yaml");
      auto opt = rt.make_optimizer(*net);
      if (load)
        rt.load_checkpoint(ckpt, *net, opt);
      else
        scatter_replicas(net, rank);
      for (int t = first; t < last; ++t) random_batch_step(net, opt, rank, t);
      if (save) rt.save_checkpoint(ckpt, *net, opt);
      write_doubles(rank_file(dir, tag, rank), flat_params(net));
      return 0;
    });
    for (int c : codes) REQUIRE(c == 0);
  };
  // max_abs_diff skips NaN (std::max): a diverged run must not compare equal.
  auto finite_diff = [](const std::vector<double>& a, const std::vector<double>& b) {
    for (const auto* v : {&a, &b})
      for (double x : *v)
        if (!std::isfinite(x)) return static_cast<double>(INFINITY);
    return max_abs_diff(a, b);
  };
  run("host", 0, 9, false, false, "host");
  run("torch", 0, 9, false, false, "torch");
  run("host", 0, 5, false, true, "host_half");
  run("torch", 5, 9, true, false, "host_then_torch");
  run("torch", 0, 5, false, true, "torch_half");
  run("host", 5, 9, true, false, "torch_then_host");
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const auto host = read_doubles(rank_file(dir, "host", r));
    CHECK(finite_diff(read_doubles(rank_file(dir, "torch", r)), host) == 0);
    CHECK(finite_diff(read_doubles(rank_file(dir, "host_then_torch", r)), host) == 0);
    CHECK(finite_diff(read_doubles(rank_file(dir, "torch_then_host", r)), host) == 0);
    // Not trivially equal: ranks hold different replicas, and training moved them.
    CHECK(max_abs_diff(read_doubles(rank_file(dir, "host_half", r)), host) > 1e-4);
    if (r > 0) CHECK(max_abs_diff(read_doubles(rank_file(dir, "host", 0)), host) > 1e-6);
  }
  distopt::test::remove_tree(dir);
}
