// `distopt bench step`: the inner-optimizer step on a model of --tensors
// parameter tensors of mixed sizes (log-uniform in 1e3..1e6 elements, scaled
// to --total elements), unfused libtorch optimizer vs the `fused` algorithm
// (single process, world size 1, through the real runtime and plugin), with
// the machine's copy bandwidth measured in the same run. Bytes per element
// moved by a step: Adam 28 (read p, g, m, v; write p, m, v), SGD with
// momentum 20; the floor is bytes / copy bandwidth (a copy moves 8 bytes per
// fp32 element: read + write).
// --hybrid adds the `hybrid` algorithm (Megatron HybridDeviceOptimizer) at
// offload_fraction 0, 0.5 and 1 with overlap_cpu_optimizer_d2h_h2d on and
// off. On a CPU-only machine its "device" is the CPU: the rows show the cost
// of the host copies and the pipeline, not a GPU's; GPU rows need a GPU.
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"

namespace po = boost::program_options;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double median_seconds(int iters, F&& f) {
  std::vector<double> t;
  f();  // warm-up: state allocation, page faults
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int distopt_bench_step(int argc, char** argv) {
  int tensors = 256, iters = 10;
  double total_m = 25;
  std::string optimizer = "adam", plugin_dir;
  bool hybrid = false;
  po::options_description desc("distopt bench step: unfused vs fused inner-optimizer step");
  desc.add_options()("help,h", "this help")("tensors", po::value(&tensors)->default_value(256),
                                            "parameter tensors")(
      "total", po::value(&total_m)->default_value(25), "total elements, millions")(
      "optimizer", po::value(&optimizer)->default_value("adam"),
      "adam, adamw or sgd (momentum 0.9)")("iters", po::value(&iters)->default_value(10),
                                           "timed steps (median reported)")(
      "plugin-path,P", po::value(&plugin_dir), "also search DIR for the fused/mean/tcp plugins")(
      "hybrid", po::bool_switch(&hybrid),
      "also time the hybrid algorithm at offload_fraction 0, 0.5, 1, overlap on and off");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (tensors < 1 || total_m <= 0 || iters < 1) throw distopt::Error("bench step: bad sizes");
  if (optimizer != "adam" && optimizer != "adamw" && optimizer != "sgd")
    throw distopt::Error("bench step: --optimizer must be adam, adamw or sgd");

  // Sizes: log-uniform in [1e3, 1e6], scaled so they sum to --total.
  std::mt19937 rng(0);
  std::uniform_real_distribution<double> u(3, 6);
  std::vector<double> raw(tensors);
  double sum = 0;
  for (auto& r : raw) sum += (r = std::pow(10.0, u(rng)));
  const double scale = total_m * 1e6 / sum;
  std::vector<std::pair<std::string, at::Tensor>> a, b;
  int64_t n = 0;
  torch::manual_seed(0);
  for (int i = 0; i < tensors; ++i) {
    int64_t k = std::max<int64_t>(1, std::llround(raw[i] * scale));
    n += k;
    at::Tensor p = at::randn({k});
    a.emplace_back("p" + std::to_string(i), p.clone().set_requires_grad(true));
    b.emplace_back("p" + std::to_string(i), p.clone().set_requires_grad(true));
  }

  // Copy bandwidth: one n-element fp32 copy moves 8n bytes.
  at::Tensor src = at::randn({n}), dst = at::empty({n});
  const double t_copy = median_seconds(iters, [&] { dst.copy_(src); });
  const double copy_gbs = 8.0 * n / t_copy / 1e9;

  // Unfused: libtorch's optimizer over the tensors.
  std::vector<at::Tensor> ps;
  for (auto& [name, p] : a) {
    p.mutable_grad() = at::randn_like(p);
    ps.push_back(p);
  }
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (optimizer == "adam")
    opt = std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-3));
  else if (optimizer == "adamw")
    opt = std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-3));
  else
    opt = std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(1e-3).momentum(0.9));
  const double t_unfused = median_seconds(iters, [&] { opt->step(); });

  // An algorithm through the real runtime and plugin on a fresh copy of the
  // parameters (world size 1: the mean reducer's bucket reduction is a
  // no-op; step() includes it).
  auto time_algorithm = [&](const std::string& algorithm) {
    std::ostringstream y;
    y << "plugins: {paths: [" << (plugin_dir.empty() ? "" : "'" + plugin_dir + "'") << "]}\n"
      << "world: {size: 1}\ncommunicator: {name: tcp}\nreducer: {name: mean}\n"
      << "algorithm: " << algorithm << "\noptimizer: {name: " << optimizer << ", lr: 1.0e-3"
      << (optimizer == "sgd" ? ", momentum: 0.9" : "") << "}\n";
    std::vector<std::pair<std::string, at::Tensor>> c;
    for (auto& [name, p] : b) c.emplace_back(name, p.detach().clone().set_requires_grad(true));
    distopt::ProcessInfo proc;
    proc.source = "bench";
    auto rt =
        distopt::Runtime::from_config(distopt::parse_job_config(y.str(), "bench-step.yaml"), proc);
    auto dopt = rt.make_optimizer(c);
    for (auto& [name, p] : c) p.grad().normal_();
    return median_seconds(iters, [&] { dopt.step(); });
  };
  const double t_fused = time_algorithm("{name: fused}");
  std::vector<std::pair<std::string, double>> hybrid_rows;
  if (hybrid)
    for (const char* f : {"0", "0.5", "1"})
      for (const char* overlap : {"false", "true"})
        hybrid_rows.emplace_back(
            std::string("hybrid f=") + f + (overlap[0] == 't' ? " ovl" : " seq"),
            time_algorithm(std::string("{name: hybrid, options: {offload_fraction: ") + f +
                           ", overlap_cpu_optimizer_d2h_h2d: " + overlap + "}}"));

  const double bytes_per = optimizer == "sgd" ? 20.0 : 28.0;
  const double floor_s = bytes_per * n / (copy_gbs * 1e9);
  std::printf(
      "bench step: %s, %d tensors, %lld elements (%.1f MB fp32), %d threads, median of %d\n",
      optimizer.c_str(), tensors, static_cast<long long>(n), 4.0 * n / 1e6, at::get_num_threads(),
      iters);
  std::printf("copy bandwidth: %.2f GB/s (read+write); floor = %.0f B/elem / copy bw = %.2f ms\n",
              copy_gbs, bytes_per, floor_s * 1e3);
  std::printf("%-16s %12s %10s %14s %12s\n", "variant", "ms/step", "GB/s", "x floor time",
              "speedup");
  auto row = [&](const char* name, double t) {
    std::printf("%-16s %12.2f %10.2f %14.2f %12.2f\n", name, t * 1e3, bytes_per * n / t / 1e9,
                t / floor_s, t_unfused / t);
  };
  row("unfused", t_unfused);
  row("fused", t_fused);
  for (const auto& [name, t] : hybrid_rows) row(name.c_str(), t);
  if (hybrid)
    std::printf(
        "hybrid: CPU-only rows (the \"device\" is the CPU; ovl = overlap on, seq = off). GPU "
        "rows (device step, D2H/H2D on streams, GPU memory saved) are missing: no GPU.\n");
  return 0;
}
