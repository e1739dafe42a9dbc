// `fused` (Bagua fuse_optimizer) against the unfused inner optimizer: the
// same 2-rank job run with algorithm `allreduce` (libtorch's SGD/Adam/AdamW
// per tensor) and with `fused` (one pass per group) ends with parameters
// equal to 1e-6 after 20 steps, with 2 parameter groups (different lr and
// weight decay), with both update codes: kernels host (the CPU loops) and
// kernels torch (the device path: libtorch multi-tensor ops, run here on CPU
// tensors). check_flatten detects a user's param.set_data(...). A checkpoint
// saved by one update code resumes in the other.
// Children do all the torch work and write parameters to files.
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10, kBatch = 8, kSteps = 20;

using Net = Mlp3;  // kIn (20) -> 32 -> 16 -> kClasses (10)

// max_abs_diff, but infinite when either side has a non-finite value
// (max_abs_diff's std::max skips NaN: a diverged run would compare equal).
double diff(const std::vector<double>& a, const std::vector<double>& b) {
  for (const auto* v : {&a, &b})
    for (double x : *v)
      if (!std::isfinite(x)) return INFINITY;
  return max_abs_diff(a, b);
}

struct Job {
  int world = 2;
  std::string algorithm = "fused", algorithm_options = "{}", optimizer;
  std::string reducer_options = "{bucket_cap_mb: 0.002}";  // several buckets
  int set_data_at = -1;                    // step before which every parameter's .data is replaced
  int first_step = 0, last_step = kSteps;  // steps [first_step, last_step) are run
  std::string load, save;                  // checkpoint read before / written after them
};

// Run the job; returns rank 0's parameters after kSteps (ranks agree: checked).
std::vector<double> run_job(const Job& j) {
  const std::string dir = make_temp_dir("distopt_fused");
  const int port = random_port();
  std::ostringstream y;
  y << plugins_and_world_yaml(j.world, port) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean, options: " << j.reducer_options << "}\n"
    << "algorithm: {name: " << j.algorithm << ", options: " << j.algorithm_options << "}\n"
    << "optimizer: " << j.optimizer << "\n";
  const std::string yaml = y.str();
  auto codes = fork_ranks(
      j.world,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(1234);
        at::Tensor X = at::randn({kSteps * j.world * kBatch, kIn});
        at::Tensor Y = at::randint(0, kClasses, {kSteps * j.world * kBatch});
        distopt::test::seed_cpu(42);
        Net net;
        auto rt = rank_runtime(yaml, rank, j.world, "fused.yaml");
        // group 1: fc2 with its own lr and weight decay
        distopt::ParamGroupSpec g1;
        g1.names = {"fc2.weight", "fc2.bias"};
        g1.lr = 0.02;
        g1.weight_decay = 0.05;
        auto opt = rt.make_optimizer(*net, {distopt::ParamGroupSpec{}, g1});
        if (!j.load.empty()) rt.load_checkpoint(j.load, *net, opt);
        for (int step = j.first_step; step < j.last_step; ++step) {
          if (step == j.set_data_at) {
            at::NoGradGuard ng;
            for (auto& p : net->parameters()) p.set_data(p.detach().clone());
          }
          opt.zero_grad();
          const int64_t at0 = (static_cast<int64_t>(step) * j.world + rank) * kBatch;
          auto out = net->forward(X.narrow(0, at0, kBatch));
          at::nll_loss(at::log_softmax(out, 1), Y.narrow(0, at0, kBatch)).backward();
          opt.step();
        }
        if (!j.save.empty()) rt.save_checkpoint(j.save, *net, opt);
        write_doubles(dir + "/rank" + std::to_string(rank) + ".bin", flat_params(net));
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < j.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
  }
  auto p0 = read_doubles(dir + "/rank0.bin");
  for (int r = 1; r < j.world; ++r)
    CHECK(diff(read_doubles(dir + "/rank" + std::to_string(r) + ".bin"), p0) <= 1e-6);
  distopt::test::remove_tree(dir);
  return p0;
}

// `opts` with the kernels option added ("{}" -> "{kernels: torch}").
std::string with_kernels(const std::string& opts, const std::string& kernels) {
  const std::string k = "kernels: " + kernels;
  return opts == "{}" ? "{" + k + "}" : opts.substr(0, opts.size() - 1) + ", " + k + "}";
}

// fused with both update codes equals the unfused optimizer, and each other.
void check_fused_equals_unfused(const std::string& optimizer, const std::string& fused_opts) {
  CAPTURE(optimizer);
  CAPTURE(fused_opts);
  Job unfused;
  unfused.algorithm = "allreduce";
  unfused.optimizer = optimizer;
  Job host = unfused;
  host.algorithm = "fused";
  host.algorithm_options = with_kernels(fused_opts, "host");
  Job torch_ops = host;
  torch_ops.algorithm_options = with_kernels(fused_opts, "torch");
  const auto a = run_job(unfused), b = run_job(host), c = run_job(torch_ops);
  CHECK(diff(a, b) <= 1e-6);
  CHECK(diff(a, c) <= 1e-6);
  CHECK(diff(b, c) <= 1e-6);
}

}  // namespace

TEST_CASE("fused SGD(momentum, nesterov) equals the unfused optimizer, 2 ranks, 2 groups") {
  check_fused_equals_unfused("{name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.01}", "{}");
  check_fused_equals_unfused("{name: sgd, lr: 0.05, momentum: 0.9, nesterov: true}",
                             "{do_flatten: false}");
}

TEST_CASE("fused Adam equals the unfused optimizer, 2 ranks, 2 groups") {
  check_fused_equals_unfused("{name: adam, lr: 0.01, weight_decay: 0.01}", "{}");
  check_fused_equals_unfused("{name: adam, lr: 0.01, amsgrad: true}", "{do_flatten: false}");
}

TEST_CASE("fused AdamW equals the unfused optimizer, 2 ranks, 2 groups") {
  check_fused_equals_unfused("{name: adamw, lr: 0.01, weight_decay: 0.1}", "{}");
}

TEST_CASE("check_flatten detects param.set_data() after flattening") {
  Job ref;
  ref.algorithm = "allreduce";
  ref.optimizer = "{name: adam, lr: 0.01}";
  // set_data with a clone changes the memory, not the values: the run must
  // equal one without it (allreduce keeps the memory it was created with,
  // so the reference does not replace anything).
  Job fused = ref;
  fused.algorithm = "fused";
  fused.set_data_at = 5;
  const auto a = run_job(ref);
  const auto b = run_job(fused);
  CHECK(diff(a, b) <= 1e-6);  // training went on in the new memory, state kept
  // Without the check the plugin keeps updating the old memory: the model's
  // parameters freeze at their step-5 values and differ from the reference.
  fused.algorithm_options = "{check_flatten: false}";
  const auto c = run_job(fused);
  CHECK(max_abs_diff(a, c) > 1e-3);
}

TEST_CASE("kernels torch: check_flatten follows param.set_data() too") {
  Job ref;
  ref.algorithm = "allreduce";
  ref.optimizer = "{name: adam, lr: 0.01}";
  Job fused = ref;
  fused.algorithm = "fused";
  fused.algorithm_options = "{kernels: torch}";
  fused.set_data_at = 5;
  CHECK(diff(run_job(ref), run_job(fused)) <= 1e-6);
}

TEST_CASE("a checkpoint saved by one update code resumes in the other") {
  const std::string dir = make_temp_dir("distopt_fused_ckpt");
  for (const char* optimizer : {"{name: adam, lr: 0.01, amsgrad: true, weight_decay: 0.01}",
                                "{name: sgd, lr: 0.05, momentum: 0.9, nesterov: true}"}) {
    CAPTURE(optimizer);
    Job straight;
    straight.optimizer = optimizer;
    straight.algorithm_options = "{kernels: host}";
    const auto whole = run_job(straight);  // 20 steps in one run
    for (const auto& [first, second] : {std::pair<std::string, std::string>{"host", "torch"},
                                        std::pair<std::string, std::string>{"torch", "host"}}) {
      CAPTURE(first);
      const std::string ckpt = dir + "/" + first;
      Job a = straight;
      a.algorithm_options = "{kernels: " + first + "}";
      a.last_step = kSteps / 2;
      a.save = ckpt;
      const auto half = run_job(a);
      CHECK(max_abs_diff(half, whole) > 1e-4);  // halfway is not the end
      Job b = straight;
      b.algorithm_options = "{kernels: " + second + "}";
      b.first_step = kSteps / 2;
      b.load = ckpt;
      CHECK(diff(run_job(b), whole) <= 1e-6);
    }
  }
  distopt::test::remove_tree(dir);
}
