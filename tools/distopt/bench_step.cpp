// `distopt bench step`: the inner-optimizer step on a model of --tensors
// parameter tensors of mixed sizes (log-uniform in 1e3..1e6 elements, scaled
// to --total elements), on --device cpu or cuda:
//   unfused     torch::optim::{Adam,AdamW,SGD}: one libtorch op chain per tensor
//   torch fused at::_fused_adam_ / _fused_adamw_ (what torch.optim.Adam(fused=True)
//               runs), when this libtorch has it for the device
//   fused       the `fused` algorithm through the real runtime and plugin (world
//               size 1 over tcp on the CPU, nccl on CUDA), step() after an
//               untimed backward, as in training
//   hybrid ...  (--hybrid) the `hybrid` algorithm at offload_fraction 0, 0.5
//               and 1 with overlap_cpu_optimizer_d2h_h2d on and off
// against the memory floor: bytes a step must move (Adam 28 B/element: read
// p, g, m, v, write p, m, v; SGD with momentum 20) over the device's copy
// bandwidth. The copy is timed exactly as the steps are (same device and
// threads, one warm-up, the median of --iters with min and max, device
// synchronised around each), before and after the variants; the floor uses
// the fastest copy seen, so it is a lower bound on the same measurement, and a
// row below it is flagged rather than hidden.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
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

struct Timing {
  std::vector<double> s;  // sorted seconds per iteration
  double median() const { return s[s.size() / 2]; }
  double min() const { return s.front(); }
  double max() const { return s.back(); }
};

// One warm-up call (state allocation, page faults, kernel selection), then
// `iters` timed calls; on CUDA the device is synchronised before the clock
// starts and before it stops, so a row is the device time of the whole step.
// `setup` runs before each call, outside the clock.
template <class S, class F>
Timing time_it(int iters, bool cuda, S&& setup, F&& f) {
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  Timing t;
  setup();
  f();
  sync();
  for (int i = 0; i < iters; ++i) {
    setup();
    sync();
    auto t0 = std::chrono::steady_clock::now();
    f();
    sync();
    t.s.push_back(seconds_since(t0));
  }
  std::sort(t.s.begin(), t.s.end());
  return t;
}
template <class F>
Timing time_it(int iters, bool cuda, F&& f) {
  return time_it(
      iters, cuda, [] {}, std::forward<F>(f));
}

// The command line, with the device-dependent defaults filled in.
struct BenchArgs {
  int tensors = 256, iters = 10;
  double total_m = 0;  // millions of elements
  std::string optimizer = "adam", plugin_dir, device_name = "cpu", communicator;
  bool hybrid = false;
  bool cuda = false;
  std::vector<int> align_bytes;  // extra `fused` rows, one per reducer align_bytes
};

// Parses and checks the options; nullopt after --help.
std::optional<BenchArgs> parse_bench_args(int argc, char** argv) {
  BenchArgs a;
  po::options_description desc(
      "distopt bench step: unfused vs fused inner-optimizer step against the memory floor");
  desc.add_options()("help,h", "this help")(
      "device", po::value(&a.device_name)->default_value("cpu"),
      "cpu or cuda (the GPU of index 0; needs a libtorch with CUDA and a visible GPU)")(
      "tensors", po::value(&a.tensors)->default_value(256), "parameter tensors")(
      "total", po::value(&a.total_m),
      "total elements, millions (default: 25 on cpu, 1000 = ~1B parameters on cuda)")(
      "optimizer", po::value(&a.optimizer)->default_value("adam"),
      "adam, adamw or sgd (momentum 0.9)")("iters", po::value(&a.iters)->default_value(10),
                                           "timed steps (median, min and max reported)")(
      "plugin-path,P", po::value(&a.plugin_dir), "also search DIR for the plugins")(
      "communicator", po::value(&a.communicator),
      "communicator of the runtime rows (default: tcp on cpu, nccl on cuda)")(
      "hybrid", po::bool_switch(&a.hybrid),
      "also time the hybrid algorithm at offload_fraction 0, 0.5, 1, overlap on and off")(
      "align-bytes", po::value(&a.align_bytes)->multitoken(),
      "also time `fused` with the mean reducer's align_bytes at each N (bytes; the default "
      "row uses 8): e.g. --align-bytes 16 64");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return std::nullopt;
  }
  if (a.device_name != "cpu" && a.device_name != "cuda")
    throw distopt::Error("bench step: --device must be cpu or cuda, got '" + a.device_name + "'");
  a.cuda = a.device_name == "cuda";
  if (a.cuda && !torch::cuda::is_available())
    throw distopt::Error(
        "bench step: --device cuda needs a libtorch built with CUDA and a visible GPU; "
        "torch::cuda::is_available() is false here (a CPU-only libtorch such as Debian's, or "
        "no GPU visible)");
  if (!vm.count("total")) a.total_m = a.cuda ? 1000 : 25;
  if (a.communicator.empty()) a.communicator = a.cuda ? "nccl" : "tcp";
  if (a.tensors < 1 || a.total_m <= 0 || a.iters < 1) throw distopt::Error("bench step: bad sizes");
  for (int al : a.align_bytes)
    if (al < 1)
      throw distopt::Error("bench step: --align-bytes must be >= 1, got " + std::to_string(al));
  if (a.optimizer != "adam" && a.optimizer != "adamw" && a.optimizer != "sgd")
    throw distopt::Error("bench step: --optimizer must be adam, adamw or sgd");
  return a;
}

// `tensors` sizes log-uniform in [1e3, 1e6] (seed 0), scaled so they sum to
// `total_m` millions (each at least 1).
std::vector<int64_t> tensor_sizes(int tensors, double total_m) {
  std::mt19937 rng(0);
  std::uniform_real_distribution<double> u(3, 6);
  std::vector<double> raw(tensors);
  double sum = 0;
  for (auto& r : raw) sum += (r = std::pow(10.0, u(rng)));
  const double scale = total_m * 1e6 / sum;
  std::vector<int64_t> sizes;
  for (int i = 0; i < tensors; ++i)
    sizes.push_back(std::max<int64_t>(1, std::llround(raw[i] * scale)));
  return sizes;
}

// One row of the table: a variant's timing, or why it has none.
struct Row {
  std::string name;
  std::optional<Timing> t;
  std::string note;  // why there is no time
};

// What every variant shares: the options, the tensor sizes and the device.
struct Bench {
  BenchArgs a;
  std::vector<int64_t> sizes;
  at::TensorOptions fopt;

  // Fresh parameters for one variant (each variant gets its own and frees
  // them, so a 1B-element run holds one set at a time); with gradients for
  // the libtorch rows (the runtime rows get theirs from make_optimizer).
  std::vector<at::Tensor> make_params(bool with_grad) const {
    std::vector<at::Tensor> ps;
    for (int64_t k : sizes) {
      at::Tensor p = at::randn({k}, fopt).set_requires_grad(true);
      if (with_grad) p.mutable_grad() = at::randn_like(p);
      ps.push_back(p);
    }
    return ps;
  }
};

// Copy bandwidth, timed as the steps are: one n-element fp32 copy moves 8n
// bytes; appends the seconds of each copy to `copy_s`.
void time_copy(const Bench& b, int64_t n, std::vector<double>& copy_s) {
  at::Tensor src = at::randn({n}, b.fopt), dst = at::empty({n}, b.fopt);
  Timing t = time_it(b.a.iters, b.a.cuda, [&] { dst.copy_(src); });
  copy_s.insert(copy_s.end(), t.s.begin(), t.s.end());
}

// unfused: libtorch's optimizer over the tensors.
Row time_unfused(const Bench& b) {
  auto ps = b.make_params(true);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (b.a.optimizer == "adam")
    opt = std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-3));
  else if (b.a.optimizer == "adamw")
    opt = std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-3));
  else
    opt = std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(1e-3).momentum(0.9));
  return {"unfused", time_it(b.a.iters, b.a.cuda, [&] { opt->step(); }), ""};
}

// torch's fused multi-tensor Adam, as torch.optim.Adam(fused=True) calls it.
// plugin_layout: the same kernel over the memory as the `fused` plugin lays
// it out (gradients packed in one buffer in reverse order at 8-byte
// offsets, as the buckets hold them; moments in two buffers at 64-byte
// offsets; one 0-dim step tensor shared by every parameter). Beside the
// other two rows it tells whether a gap between `fused` and `torch fused`
// is the layout or the runtime around the kernel.
Row time_torch_fused(const Bench& b, bool plugin_layout) {
  const std::string& optimizer = b.a.optimizer;
  Row r{plugin_layout ? "torch fused lay" : "torch fused", std::nullopt, ""};
  if (optimizer == "sgd") {
    r.note = "no fused SGD baseline here";
  } else if (optimizer == "adamw" && TORCH_VERSION_MAJOR < 2) {
    r.note = "at::_fused_adamw_ needs libtorch >= 2 (this is " TORCH_VERSION ")";
  } else {
    try {
      auto ps = b.make_params(!plugin_layout);
      std::vector<at::Tensor> gs, ms, vs, steps;
      at::Tensor step0 = at::zeros({}, b.fopt);
      if (plugin_layout) {
        auto up = [](int64_t n, int64_t a) { return (n + a - 1) / a * a; };
        const size_t np = ps.size();
        std::vector<int64_t> goff(np), soff(np);
        int64_t gtotal = 0, stotal = 0;
        for (size_t k = np; k-- > 0;) {  // buckets fill in backward order
          goff[k] = up(gtotal, 2);       // 8 bytes: the reducer's default align_bytes
          gtotal = goff[k] + ps[k].numel();
        }
        for (size_t k = 0; k < np; ++k) {
          soff[k] = stotal;
          stotal += up(ps[k].numel(), 16);  // 64 bytes, as fused's kStateAlign
        }
        at::Tensor gflat = at::randn({gtotal}, b.fopt);
        at::Tensor mflat = at::zeros({stotal}, b.fopt), vflat = at::zeros({stotal}, b.fopt);
        for (size_t k = 0; k < np; ++k) {
          gs.push_back(gflat.narrow(0, goff[k], ps[k].numel()));
          ms.push_back(mflat.narrow(0, soff[k], ps[k].numel()));
          vs.push_back(vflat.narrow(0, soff[k], ps[k].numel()));
          steps.push_back(step0);
        }
      } else {
        for (auto& p : ps) {
          gs.push_back(p.grad());
          ms.push_back(at::zeros_like(p));
          vs.push_back(at::zeros_like(p));
          steps.push_back(at::zeros({1}, b.fopt));  // float step counts on the device, as torch's
        }
      }
      double k = 0;
      auto step = [&] {
        at::NoGradGuard ng;
        if (plugin_layout)
          step0.fill_(++k);  // as fused_torch.cpp
        else
          at::_foreach_add_(steps, 1);
        if (optimizer == "adam")
          at::_fused_adam_(ps, gs, ms, vs, {}, steps, 1e-3, 0.9, 0.999, 0, 1e-8, false, false);
#if TORCH_VERSION_MAJOR >= 2
        else
          at::_fused_adamw_(ps, gs, ms, vs, {}, steps, 1e-3, 0.9, 0.999, 1e-2, 1e-8, false, false);
#endif
      };
      r.t = time_it(b.a.iters, b.a.cuda, step);
    } catch (const c10::Error& e) {
      // e.g. libtorch < 2.4 has no CPU kernel for it.
      std::string what = e.what_without_backtrace();
      r.note = "unsupported by this libtorch (" TORCH_VERSION ") on " + b.a.device_name + ": " +
               what.substr(0, std::min(what.find('\n'), what.find(". ")));
    }
  }
  return r;
}

// An algorithm through the real runtime and plugin on fresh parameters
// (world size 1), timed as a training step pays for it: each step() follows
// an untimed zero_grad() and backward that put fixed random gradients into
// the buckets and launched them (at world size 1 the mean reducer's
// allreduce is a no-op in place), so the row is the optimizer step alone, as
// the libtorch rows are. Without the backward, step() would count every
// gradient as missing and zero it first (an unused parameter's rule).
Row time_algorithm(const Bench& b, const std::string& name, const std::string& algorithm,
                   const std::string& reducer = "{name: mean}") {
  const BenchArgs& a = b.a;
  std::ostringstream y;
  y << "plugins: {paths: [" << (a.plugin_dir.empty() ? "" : "'" + a.plugin_dir + "'") << "]}\n"
    << "world: {size: 1}\ncommunicator: {name: " << a.communicator << "}\nreducer: " << reducer
    << "\nalgorithm: " << algorithm << "\noptimizer: {name: " << a.optimizer << ", lr: 1.0e-3"
    << (a.optimizer == "sgd" ? ", momentum: 0.9" : "") << "}\n";
  Row r{name, std::nullopt, ""};
  try {
    auto ps = b.make_params(false);
    std::vector<std::pair<std::string, at::Tensor>> c;
    for (size_t i = 0; i < ps.size(); ++i) c.emplace_back("p" + std::to_string(i), ps[i]);
    distopt::ProcessInfo proc;
    proc.source = "bench";
    auto rt =
        distopt::Runtime::from_config(distopt::parse_job_config(y.str(), "bench-step.yaml"), proc);
    auto dopt = rt.make_optimizer(c);
    std::vector<at::Tensor> gs;
    for (auto& p : ps) gs.push_back(at::randn_like(p));
    auto backward = [&] {
      dopt.zero_grad();
      at::Tensor loss = at::zeros({}, b.fopt);
      for (size_t i = 0; i < ps.size(); ++i) loss = loss + (ps[i] * gs[i]).sum();
      loss.backward();  // d loss / d p_i = g_i
    };
    r.t = time_it(a.iters, a.cuda, backward, [&] { dopt.step(); });
  } catch (const std::exception& e) {
    std::string what = e.what();
    r.note = "failed: " + what.substr(0, what.find('\n'));
  }
  return r;
}

// The table: each row against the floor (bytes a step moves over the
// fastest copy) and against the unfused row (rows[0]).
void print_report(const BenchArgs& a, int64_t n, std::vector<double> copy_s,
                  const std::vector<Row>& rows) {
  std::sort(copy_s.begin(), copy_s.end());
  const double copy_med = copy_s[copy_s.size() / 2];
  const double bytes_per = a.optimizer == "sgd" ? 20.0 : 28.0;
  const double floor_s = bytes_per / 8.0 * copy_s.front();  // fastest copy: a true lower bound
  std::printf(
      "bench step: %s on %s, %d tensors, %lld elements (%.1f MB fp32), %d threads, median of %d "
      "(min..max)\n",
      a.optimizer.c_str(), a.device_name.c_str(), a.tensors, static_cast<long long>(n),
      4.0 * n / 1e6, at::get_num_threads(), a.iters);
  std::printf(
      "copy bandwidth: %.2f GB/s median (%.2f..%.2f) over %zu copies of %.1f MB, timed as the "
      "steps; floor = %.0f B/elem / fastest copy = %.2f ms\n",
      8.0 * n / copy_med / 1e9, 8.0 * n / copy_s.back() / 1e9, 8.0 * n / copy_s.front() / 1e9,
      copy_s.size(), 4.0 * n / 1e6, bytes_per, floor_s * 1e3);
  std::printf("%-16s %12s %10s %14s %12s %20s\n", "variant", "ms/step", "GB/s", "x floor time",
              "speedup", "min..max ms");
  const double t_unfused = rows[0].t->median();
  bool below = false;
  for (const Row& r : rows) {
    if (!r.t) {
      std::printf("%-16s %12s  %s\n", r.name.c_str(), "-", r.note.c_str());
      continue;
    }
    const double t = r.t->median();
    below = below || t < floor_s;
    std::printf("%-16s %12.2f %10.2f %14.2f %12.2f %9.2f..%-9.2f%s\n", r.name.c_str(), t * 1e3,
                bytes_per * n / t / 1e9, t / floor_s, t_unfused / t, r.t->min() * 1e3,
                r.t->max() * 1e3, t < floor_s ? "  BELOW FLOOR" : "");
  }
  std::printf(
      "torch fused lay: torch's kernel over the fused plugin's memory layout (gradients packed "
      "as in buckets, moments at 64-byte offsets, one shared step tensor)\n");
  if (below)
    std::printf(
        "note: a row below the floor moved fewer bytes than counted (caches hold part of the "
        "state at this size) or the copy was slowed by the machine; use a larger --total.\n");
  if (a.hybrid && !a.cuda)
    std::printf(
        "hybrid: CPU-only rows (the \"device\" is the CPU; ovl = overlap on, seq = off); run "
        "with --device cuda on a GPU for the device rows.\n");
}

}  // namespace

int distopt_bench_step(int argc, char** argv) {
  std::optional<BenchArgs> args = parse_bench_args(argc, argv);
  if (!args) return 0;
  Bench b;
  b.a = *args;
  const at::Device dev = b.a.cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  b.fopt = at::TensorOptions().dtype(at::kFloat).device(dev);
  b.sizes = tensor_sizes(b.a.tensors, b.a.total_m);
  int64_t n = 0;
  for (int64_t k : b.sizes) n += k;
  torch::manual_seed(0);

  std::vector<double> copy_s;
  time_copy(b, n, copy_s);
  std::vector<Row> rows;
  rows.push_back(time_unfused(b));
  rows.push_back(time_torch_fused(b, false));
  rows.push_back(time_torch_fused(b, true));
  rows.push_back(time_algorithm(b, "fused", "{name: fused}"));
  for (int al : b.a.align_bytes)
    rows.push_back(
        time_algorithm(b, "fused a=" + std::to_string(al), "{name: fused}",
                       "{name: mean, options: {align_bytes: " + std::to_string(al) + "}}"));
  if (b.a.hybrid)
    for (const char* f : {"0", "0.5", "1"})
      for (const char* overlap : {"false", "true"})
        rows.push_back(
            time_algorithm(b, std::string("hybrid f=") + f + (overlap[0] == 't' ? " ovl" : " seq"),
                           std::string("{name: hybrid, options: {offload_fraction: ") + f +
                               ", overlap_cpu_optimizer_d2h_h2d: " + overlap + "}}"));
  time_copy(b, n, copy_s);  // again: the machine may have changed pace meanwhile
  print_report(b.a, n, copy_s, rows);
  return 0;
}
