// `distopt bench shard`: per-rank memory and throughput of the sharding
// stages side by side, in one run, on one model: allreduce (nothing
// sharded), zero stage 1 (optimizer state), 2 (and gradients), 3 (and
// parameters), each at 1, 2 and 4 local ranks (fork, tcp, loopback).
//
// The model: an MLP of --layers square Linear layers (width chosen so that
// the model has about --params parameters), each a distopt::ShardedUnit,
// trained with Adam (fp32: 4 + 4 + 8 bytes per parameter for parameter,
// gradient and moments; --precision bf16: a bf16 model with fp32 master
// weights, allreduce and stage 3 only). Per rank and configuration:
//   peak      the rank's resident-memory high-water mark (VmHWM) over the
//             timed steps minus its resident memory before it built the
//             model: what the parameters, gradients, optimizer state,
//             communication buffers and activations took while training
//             (the high-water mark is reset after the warm-up step through
//             /proc/self/clear_refs: libtorch modules allocate their
//             parameters whole when built, on every rank, before any
//             sharding);
//   theory    ZeRO's per-rank bytes for the stage (the paper's Table 1 with
//             K = 8): allreduce 16 P, stage 1 (8 + 8/N) P, stage 2
//             (4 + 12/N) P, stage 3 16 P/N plus the units' full buffers:
//             their parameters while gathered (`gathered`: the most present
//             at once, measured; one unit running and one prefetched) and
//             their gradients before the reduce-scatter (`unit grads`: the
//             most units' gradient buckets present at once, measured: one,
//             or two with overlap_comm, plus the largest parameter's
//             gradient autograd makes before it is added into its bucket);
//   samples/s the global batch over the median step time of the slowest rank.
// With --memory-cap-mb M each rank limits its data segment (RLIMIT_DATA) to
// what it holds before building the model plus M MiB: a configuration that
// needs more fails with "out of memory" in its row, the others fit.
#include <ATen/ATen.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/process.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sharded_unit.hpp"

namespace po = boost::program_options;

namespace {

struct Args {
  double params = 1e8;
  int layers = 8;
  int batch = 8;  // per rank
  int steps = 5;
  std::vector<int> ranks{1, 2, 4};
  std::vector<std::string> algorithms{"allreduce", "zero1", "zero2", "zero3"};
  double cap_mb = 0;
  std::string plugin_path;
  bool bf16 = false;  // --precision bf16: a bf16 model, fp32 masters (allreduce, zero3 only)
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t width, int layers) {
    for (int l = 0; l < layers; ++l)
      units.push_back(register_module("fc" + std::to_string(l),
                                      distopt::ShardedUnit(torch::nn::Linear(width, width))));
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t l = 0; l < units.size(); ++l) {
      x = units[l](x);
      if (l + 1 < units.size()) x = at::relu(x);
    }
    return x;
  }
  std::vector<distopt::ShardedUnit> units;
};
TORCH_MODULE(Mlp);

int64_t width_for(const Args& a) {
  // layers x (w^2 + w) >= params, w a multiple of 8
  const double per_layer = a.params / std::max(1, a.layers);
  int64_t w = static_cast<int64_t>(std::ceil(std::sqrt(per_layer)));
  return std::max<int64_t>(8, (w + 7) / 8 * 8);
}

/// Resident-set figures of this process (kB from /proc/self/status), in bytes.
uint64_t status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0)
      return std::strtoull(line.c_str() + key.size(), nullptr, 10) * 1024;
  return 0;
}

std::string algorithm_yaml(const std::string& alg) {
  if (alg == "allreduce") return "{name: allreduce}";
  if (alg == "zero1") return "{name: zero, options: {stage: 1, partition: contiguous}}";
  if (alg == "zero2") return "{name: zero, options: {stage: 2}}";
  if (alg == "zero3") return "{name: zero, options: {stage: 3}}";
  if (alg == "zero3_overlap") return "{name: zero, options: {stage: 3, overlap_comm: true}}";
  throw distopt::Error("bench shard: unknown algorithm '" + alg +
                       "' (allreduce, zero1, zero2, zero3, zero3_overlap)");
}

struct RankResult {
  double peak = 0, seconds = 0, gathered_peak = 0, unit_grads_peak = 0;
  int failed = 0;  // 1: out of memory under the cap
};

RankResult run_rank(const Args& a, const std::string& alg, int world, int rank, int port) {
  RankResult out;
  at::set_num_threads(1);
  // Blocks of 1 MiB and more are mapped and unmapped on their own, so a
  // freed unit buffer leaves the resident set at once (glibc otherwise
  // raises this threshold after each free, up to 32 MiB, and serves the next
  // buffers from a heap that keeps freed pages): the same for every row.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  std::ostringstream y;
  if (!a.plugin_path.empty()) y << "plugins: {paths: ['" << a.plugin_path << "']}\n";
  y << "world: {size: " << world << ", rendezvous: 'tcp://127.0.0.1:" << port
    << "', timeout_s: 120}\n"
    << "communicator: {name: tcp}\nreducer: {name: mean}\n"
    << "algorithm: " << algorithm_yaml(alg) << "\noptimizer: {name: adam, lr: 0.0001}\n";
  if (a.bf16) y << "precision: {dtype: bf16}\n";
  distopt::ProcessInfo proc;
  proc.rank = proc.local_rank = rank;
  proc.world_size = proc.local_world_size = world;
  proc.source = "bench";
  auto rt =
      distopt::Runtime::from_config(distopt::parse_job_config(y.str(), "bench-shard.yaml"), proc);
  const uint64_t base = status_bytes("VmRSS");
  if (a.cap_mb > 0) {
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max =
        status_bytes("VmData") + static_cast<rlim_t>(a.cap_mb * 1024 * 1024);
    setrlimit(RLIMIT_DATA, &lim);
  }
  try {
    at::manual_seed(1);
    const int64_t width = width_for(a);
    Mlp net(width, a.layers);
    if (a.bf16) net->to(at::kBFloat16);
    auto opt = rt.make_optimizer(*net);
    std::vector<double> secs;
    for (int s = 0; s < a.steps + 1; ++s) {  // the first step is warm-up
      auto x = at::randn({a.batch, width});
      if (a.bf16) x = x.to(at::kBFloat16);
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      opt.scale_loss(net->forward(x).pow(2).mean()).backward();
      opt.step();
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (s == 0) {  // the peaks from here on
        opt.sharding_memory();
        std::ofstream("/proc/self/clear_refs") << "5";
      }
    }
    const auto mem = opt.sharding_memory();
    out.gathered_peak = static_cast<double>(mem.peak_gathered);
    out.unit_grads_peak = static_cast<double>(mem.peak_unit_grads);
    secs.erase(secs.begin());
    std::sort(secs.begin(), secs.end());
    out.seconds = secs[secs.size() / 2];
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.find("alloc") == std::string::npos && what.find("memory") == std::string::npos) throw;
    out.failed = 1;
  }
  out.peak = static_cast<double>(status_bytes("VmHWM") - base);
  return out;
}

int free_port() {
  std::random_device rd;
  return 20000 + static_cast<int>(rd() % 30000);
}

/// Runs one configuration on `world` forked ranks; per rank its result.
std::vector<RankResult> run_config(const Args& a, const std::string& alg, int world) {
  const int port = free_port();
  std::vector<std::pair<pid_t, int>> children;  // pid, read end
  std::fflush(stdout);
  for (int r = 0; r < world; ++r) {
    int fds[2];
    if (pipe(fds) != 0) throw distopt::Error("bench shard: pipe failed");
    pid_t pid = fork();
    if (pid < 0) throw distopt::Error("bench shard: fork failed");
    if (pid == 0) {
      close(fds[0]);
      int rc = 0;
      RankResult res;
      try {
        res = run_rank(a, alg, world, r, port);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "distopt bench shard: %s, %d ranks, rank %d: %s\n", alg.c_str(), world,
                     r, e.what());
        rc = 1;
      }
      if (write(fds[1], &res, sizeof res) != static_cast<ssize_t>(sizeof res)) rc = 1;
      close(fds[1]);
      std::fflush(stderr);
      _exit(rc);
    }
    close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  std::vector<RankResult> results;
  for (auto& [pid, fd] : children) {
    RankResult res;
    if (read(fd, &res, sizeof res) != static_cast<ssize_t>(sizeof res)) res.failed = 2;
    close(fd);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) res.failed = std::max(res.failed, 2);
    results.push_back(res);
  }
  return results;
}

double theory_bytes(const std::string& alg, double p, int n, bool bf16) {
  // bf16: allreduce holds the bf16 model and gradients (2 + 2) besides the
  // fp32 masters, fp32 gradients and Adam (4 + 4 + 8); stage 3 shards the
  // masters, their gradients and Adam (16P/N) and keeps no bf16 copy.
  if (alg == "allreduce") return (bf16 ? 20 : 16) * p;
  if (alg == "zero1") return (8 + 8.0 / n) * p;
  if (alg == "zero2") return (4 + 12.0 / n) * p;
  return 16 * p / n;
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

std::vector<std::string> parse_strings(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(item);
  return v;
}

}  // namespace

int distopt_bench_shard(int argc, char** argv) {
  Args a;
  std::string ranks = "1,2,4", algs = "allreduce,zero1,zero2,zero3", precision = "fp32";
  po::options_description desc(
      "distopt bench shard: per-rank peak memory and samples/s of allreduce and zero stages "
      "1-3 on one MLP (Adam, fp32), at 1, 2 and 4 local ranks over tcp");
  desc.add_options()("help,h", "this help")(
      "params", po::value(&a.params)->default_value(1e8, "1e8"), "model parameters (about)")(
      "layers", po::value(&a.layers)->default_value(8), "square Linear layers, one unit each")(
      "batch", po::value(&a.batch)->default_value(8), "samples per rank and step")(
      "steps", po::value(&a.steps)->default_value(5), "timed steps (after one warm-up)")(
      "ranks", po::value(&ranks)->default_value(ranks), "world sizes, comma-separated")(
      "algorithms", po::value(&algs)->default_value(algs),
      "allreduce, zero1, zero2, zero3, zero3_overlap (stage 3 with overlap_comm: true), "
      "comma-separated")(
      "memory-cap-mb", po::value(&a.cap_mb)->default_value(0),
      "limit each rank's data segment to this many MiB above what it holds before the model "
      "(RLIMIT_DATA); 0: no cap")("precision", po::value(&precision)->default_value(precision),
                                  "fp32, or bf16: a bf16 model with fp32 master weights "
                                  "(allreduce, zero3, zero3_overlap)")(
      "plugin-path", po::value(&a.plugin_path),
      "plugin directory (default: the build's or install's)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  a.ranks = parse_ints(ranks);
  a.algorithms = parse_strings(algs);
  if (a.layers < 1 || a.batch < 1 || a.steps < 1 || a.params < 1)
    throw distopt::Error("bench shard: --params, --layers, --batch and --steps must be positive");
  for (const auto& alg : a.algorithms) algorithm_yaml(alg);  // names checked up front
  if (precision != "fp32" && precision != "bf16")
    throw distopt::Error("bench shard: --precision is fp32 or bf16, not '" + precision + "'");
  a.bf16 = precision == "bf16";
  for (const auto& alg : a.algorithms)
    if (a.bf16 && (alg == "zero1" || alg == "zero2"))
      throw distopt::Error(
          "bench shard: --precision bf16 measures allreduce, zero3 and "
          "zero3_overlap (no per-rank theory here for " +
          alg + " under mixed precision)");

  const int64_t width = width_for(a);
  const double p = static_cast<double>(a.layers) * static_cast<double>(width * width + width);
  std::printf(
      "# distopt bench shard: MLP of %d Linear(%lld, %lld) units, %.3g parameters, Adam, "
      "%s, %d samples per rank and step, tcp on loopback\n",
      a.layers, static_cast<long long>(width), static_cast<long long>(width), p,
      a.bf16 ? "bf16 model with fp32 masters" : "fp32", a.batch);
  if (a.cap_mb > 0) std::printf("# memory cap per rank: %.0f MiB (RLIMIT_DATA)\n", a.cap_mb);
  std::printf(
      "# peak: max over ranks of VmHWM in the timed steps minus the rank's RSS before the "
      "model; theory: ZeRO's bytes per rank for the stage (%s); "
      "gathered: the most unit parameters present at once, and unit grads: the most units' "
      "gradient buckets present at once (%s) plus one Linear weight's gradient (autograd's, "
      "before it is added into its bucket), stage 3, both measured and added to theory in "
      "peak/theory; malloc's mmap threshold fixed at 1 MiB\n",
      a.bf16 ? "allreduce 20P: bf16 model and gradients, fp32 masters, gradients and Adam; "
               "stage 3 16P/N"
             : "16P, (8+8/N)P, (4+12/N)P, 16P/N",
      a.bf16 ? "bf16 and their fp32 copies" : "fp32");
  std::printf("# %-13s %5s %12s %12s %12s %14s %16s %10s\n", "algorithm", "ranks", "samples/s",
              "peak(MiB)", "theory(MiB)", "gathered(MiB)", "unit grads(MiB)", "peak/theory");
  const double weight_grad_bytes = (a.bf16 ? 2.0 : 4.0) * static_cast<double>(width * width);
  for (int world : a.ranks)
    for (const auto& alg : a.algorithms) {
      auto res = run_config(a, alg, world);
      double peak = 0, secs = 0, gathered = 0, unit_grads = 0;
      int failed = 0;
      for (const auto& r : res) {
        peak = std::max(peak, r.peak);
        secs = std::max(secs, r.seconds);
        gathered = std::max(gathered, r.gathered_peak);
        unit_grads = std::max(unit_grads, r.unit_grads_peak);
        failed = std::max(failed, r.failed);
      }
      const double theory = theory_bytes(alg, p, world, a.bf16);
      const double grads = alg.rfind("zero3", 0) == 0 ? unit_grads + weight_grad_bytes : 0;
      const double mib = 1024.0 * 1024.0;
      if (failed == 1) {
        std::printf("  %-13s %5d %12s %12.0f %12.0f %14s %16s %10s\n", alg.c_str(), world,
                    "out of memory", peak / mib, theory / mib, "-", "-", "-");
      } else if (failed) {
        std::printf("  %-13s %5d %12s\n", alg.c_str(), world, "failed (see above)");
      } else {
        std::printf("  %-13s %5d %12.1f %12.0f %12.0f %14.1f %16.1f %10.2f\n", alg.c_str(), world,
                    a.batch * world / secs, peak / mib, theory / mib, gathered / mib, grads / mib,
                    peak / (theory + gathered + grads));
      }
      std::fflush(stdout);
    }
  return 0;
}
