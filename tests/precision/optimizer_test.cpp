// Mixed precision in the DistributedOptimizer on 2 real ranks over loopback
// (tcp + mean + allreduce plugins): an inf in ONE rank's gradients skips the
// step on both ranks and halves the scale; a static scale; the masters / fp32
// bucket path against the plain path; grad_clip on unscaled gradients.
//
// Forked children do all the torch work and write their results to files
// that the parent compares (the parent never forks after using torch).
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "optim/optimizer_impl.hpp"  // the fp32 masters (core/src)
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10, kBatch = 16;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, kClasses));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(at::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

struct Spec {
  std::string precision;  // YAML of `precision:` ("" = absent)
  std::string algorithm_options = "{}";
  at::ScalarType dtype = at::kBFloat16;  // the model's dtype
  int steps = 6;
  int inf_rank = -1, inf_step = -1;  // multiply that rank's loss by inf at that step
  bool nan = false;                  // by NaN instead (every gradient NaN, none inf)
};

// Per rank: final parameters (as double), and per step: loss scale after the
// step, skipped steps, steps(), and whether the step changed the parameters.
struct Result {
  std::vector<double> params, scale, skipped, steps, changed;
  std::vector<double> extra;  // after set_loss_scale_state: scale, skipped
  // Mixed precision: the fp32 masters, and max |model parameter - its
  // master rounded to the model's dtype| (as doubles).
  std::vector<double> masters, model_vs_masters;
};

void write_vec(std::ofstream& f, const std::vector<double>& v) {
  double n = static_cast<double>(v.size());
  f.write(reinterpret_cast<const char*>(&n), sizeof n);
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(double)));
}
std::vector<double> read_vec(std::ifstream& f) {
  double n = 0;
  if (!f.read(reinterpret_cast<char*>(&n), sizeof n)) return {};
  std::vector<double> v(static_cast<size_t>(n));
  f.read(reinterpret_cast<char*>(v.data()),
         static_cast<std::streamsize>(v.size() * sizeof(double)));
  return v;
}

std::string tmpdir() { return make_temp_dir("distopt_precision"); }

// Run the job on 2 ranks; returns each rank's result.
std::vector<Result> run(const Spec& s) {
  const std::string dir = tmpdir();
  std::ostringstream y;
  y << plugins_and_world_yaml(2, random_port())
    << "communicator: {name: tcp}\nreducer: {name: mean}\n"
    << "algorithm: {name: allreduce, options: " << s.algorithm_options << "}\n"
    << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n";
  if (!s.precision.empty()) y << "precision: " << s.precision << "\n";
  const std::string yaml = y.str();
  auto codes = fork_ranks(
      2,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(1234);
        at::Tensor xs = at::randn({s.steps * 2 * kBatch, kIn});
        at::Tensor ys = at::randint(0, kClasses, {s.steps * 2 * kBatch});
        distopt::test::seed_cpu(42 + rank);  // rank 1 differs until make_optimizer broadcasts
        Net net;
        net->to(s.dtype);
        auto rt = rank_runtime(yaml, rank, 2, "precision.yaml");
        auto opt = rt.make_optimizer(*net);
        Result r;
        for (int step = 0; step < s.steps; ++step) {
          const auto before = flat_params(net);
          opt.zero_grad();
          auto x = xs.narrow(0, (step * 2 + rank) * kBatch, kBatch).to(s.dtype);
          auto t = ys.narrow(0, (step * 2 + rank) * kBatch, kBatch);
          auto loss = at::nll_loss(at::log_softmax(net->forward(x).to(at::kFloat), 1), t);
          if (rank == s.inf_rank && step == s.inf_step)
            loss = loss * (s.nan ? std::numeric_limits<float>::quiet_NaN()
                                 : std::numeric_limits<float>::infinity());
          opt.scale_loss(loss).backward();
          opt.step();
          r.scale.push_back(opt.loss_scale());
          r.skipped.push_back(static_cast<double>(opt.skipped_steps()));
          r.steps.push_back(static_cast<double>(opt.steps()));
          r.changed.push_back(max_abs_diff(before, flat_params(net)));
        }
        r.params = flat_params(net);
        if (opt.mixed_precision()) {
          distopt::LossScaleState st;
          st.scale = 4096;
          st.growth_tracker = 1;
          st.skipped_steps = 9;
          opt.set_loss_scale_state(st);
          r.extra = {opt.loss_scale(), static_cast<double>(opt.skipped_steps()),
                     static_cast<double>(opt.loss_scale_state().growth_tracker)};
          const auto& impl = distopt::optim::Access::of(opt);
          const auto params = net->parameters();
          double worst = 0;
          for (size_t i = 0; i < params.size(); ++i) {
            const at::Tensor& m = impl.masters->master(i);
            at::Tensor c = m.to(at::kDouble).contiguous().view(-1);
            r.masters.insert(r.masters.end(), c.data_ptr<double>(),
                             c.data_ptr<double>() + c.numel());
            worst = std::max(worst, (params[i].detach().to(at::kDouble) -
                                     m.to(params[i].scalar_type()).to(at::kDouble))
                                        .abs()
                                        .max()
                                        .item<double>());
          }
          r.model_vs_masters = {worst};
        }
        std::ofstream f(dir + "/rank" + std::to_string(rank) + ".bin", std::ios::binary);
        for (const auto* v : {&r.params, &r.scale, &r.skipped, &r.steps, &r.changed, &r.extra,
                              &r.masters, &r.model_vs_masters})
          write_vec(f, *v);
        f.close();
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  std::vector<Result> out(2);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".bin", std::ios::binary);
    for (auto* v : {&out[r].params, &out[r].scale, &out[r].skipped, &out[r].steps, &out[r].changed,
                    &out[r].extra, &out[r].masters, &out[r].model_vs_masters})
      *v = read_vec(f);
    std::remove((dir + "/rank" + std::to_string(r) + ".bin").c_str());
  }
  std::remove(dir.c_str());
  return out;
}

// Mixed precision by hand in one libtorch process, as the header documents
// it, for run()'s job with `precision: {dtype: bf16}` (scale 65536, no
// overflow in 6 steps): each rank's bf16 gradients of the scaled loss,
// upcast, divided by the scale, averaged in fp32; SGD (lr 0.1, momentum
// 0.9) on fp32 masters that start as rank 0's bf16 weights; the model is
// the masters rounded to bf16 after each step. Returns the masters.
std::vector<double> bf16_reference(int steps) {
  const std::string dir = tmpdir();
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(1234);
    at::Tensor xs = at::randn({steps * 2 * kBatch, kIn});
    at::Tensor ys = at::randint(0, kClasses, {steps * 2 * kBatch});
    distopt::test::seed_cpu(42);  // rank 0's weights: make_optimizer broadcasts them
    Net model;
    model->to(at::kBFloat16);
    Net masters;  // fp32
    auto mp = masters->parameters(), lp = model->parameters();
    {
      at::NoGradGuard ng;
      for (size_t i = 0; i < mp.size(); ++i) mp[i].copy_(lp[i]);
    }
    torch::optim::SGD sgd(mp, torch::optim::SGDOptions(0.1).momentum(0.9));
    const double scale = 65536;
    for (int step = 0; step < steps; ++step) {
      std::vector<at::Tensor> sum(mp.size());
      for (int rank = 0; rank < 2; ++rank) {
        for (auto& p : lp) p.mutable_grad() = at::Tensor();
        auto x = xs.narrow(0, (step * 2 + rank) * kBatch, kBatch).to(at::kBFloat16);
        auto t = ys.narrow(0, (step * 2 + rank) * kBatch, kBatch);
        (at::nll_loss(at::log_softmax(model->forward(x).to(at::kFloat), 1), t) * scale).backward();
        for (size_t i = 0; i < lp.size(); ++i) {
          at::Tensor g = lp[i].grad().to(at::kFloat) / scale;
          sum[i] = rank == 0 ? g : sum[i] + g;
        }
      }
      for (size_t i = 0; i < mp.size(); ++i) mp[i].mutable_grad() = sum[i] / 2;
      sgd.step();
      at::NoGradGuard ng;
      for (size_t i = 0; i < mp.size(); ++i) lp[i].copy_(mp[i]);
    }
    write_doubles(dir + "/reference.bin", flat_params(masters));
    return 0;
  });
  REQUIRE(codes[0] == 0);
  auto out = read_doubles(dir + "/reference.bin");
  distopt::test::remove_tree(dir);
  return out;
}

}  // namespace

TEST_CASE("an inf in one rank's gradients skips the step on both ranks and halves the scale") {
  Spec s;
  s.precision = "{dtype: bf16, init_scale: 1024, growth_interval: 3}";
  s.steps = 6;
  s.inf_rank = 1;
  s.inf_step = 2;
  auto r = run(s);
  for (int k = 0; k < 2; ++k) {
    CAPTURE(k);
    REQUIRE(r[k].scale.size() == 6);
    // 2 good steps, the skipped one (x0.5), then 3 good steps grow it back (x2).
    CHECK(r[k].scale == std::vector<double>{1024, 1024, 512, 512, 512, 1024});
    CHECK(r[k].skipped == std::vector<double>{0, 0, 1, 1, 1, 1});
    CHECK(r[k].steps == std::vector<double>{1, 2, 2, 3, 4, 5});
    // The skipped step left the parameters exactly as they were, on BOTH ranks
    // (rank 0's own gradients were finite); every other step moved them.
    CHECK(r[k].changed[2] == 0.0);
    for (int step : {0, 1, 3, 4, 5}) {
      CAPTURE(step);
      CHECK(r[k].changed[step] > 0.0);
    }
    // Checkpoint state restore.
    CHECK(r[k].extra == std::vector<double>{4096, 9, 1});
  }
  CHECK(max_abs_diff(r[0].params, r[1].params) == 0.0);  // ranks stay identical
}

TEST_CASE("a NaN in one rank's gradients skips the step on both ranks too") {
  Spec s;
  s.precision = "{dtype: bf16, init_scale: 1024, growth_interval: 3}";
  s.steps = 4;
  s.inf_rank = 0;
  s.inf_step = 1;
  s.nan = true;
  auto r = run(s);
  for (int k = 0; k < 2; ++k) {
    CAPTURE(k);
    REQUIRE(r[k].scale.size() == 4);
    CHECK(r[k].scale == std::vector<double>{1024, 512, 512, 512});
    CHECK(r[k].skipped == std::vector<double>{0, 1, 1, 1});
    CHECK(r[k].changed[1] == 0.0);
    CHECK(r[k].changed[2] > 0.0);
  }
  CHECK(max_abs_diff(r[0].params, r[1].params) == 0.0);
}

TEST_CASE(
    "a static power-of-two loss scale gives the unscaled result; grad_clip sees unscaled "
    "gradients") {
  // Scaling by 2^k is exact in bf16 and fp32, so gradients unscaled from a
  // loss x 1024 equal those of the plain loss: the runs must agree. With
  // grad_clip the clip coefficient is computed on the fp32 buckets after
  // unscaling; clipping scaled gradients would shrink updates 1024x.
  Spec a;
  a.precision = "{dtype: bf16, loss_scale: 1024}";
  a.algorithm_options = "{grad_clip: 0.05}";
  Spec b = a;
  b.precision = "{dtype: bf16, loss_scale: 1}";
  Spec c = a;
  c.algorithm_options = "{}";
  auto ra = run(a), rb = run(b), rc = run(c);
  for (int k = 0; k < 2; ++k) {
    CAPTURE(k);
    CHECK(ra[k].scale == std::vector<double>(6, 1024));
    CHECK(ra[k].skipped == std::vector<double>(6, 0));
    CHECK(ra[k].steps.back() == 6);
  }
  CHECK(max_abs_diff(ra[0].params, rb[0].params) <= 1e-6);
  CHECK(max_abs_diff(ra[0].params, ra[1].params) == 0.0);
  // ... and the clip really bit (else the comparison above proves nothing).
  CHECK(max_abs_diff(ra[0].params, rc[0].params) > 1e-3);
}

TEST_CASE("the mixed-precision path in fp32 equals the plain optimizer") {
  // dtype fp32 + loss_scale: masters alias the parameters, the buckets are
  // unscaled in place and checked for inf: same numbers as no precision
  // section at all (the plain path), bit for bit with scale 1.
  Spec plain;
  plain.dtype = at::kFloat;
  Spec one = plain;
  one.precision = "{dtype: fp32, loss_scale: 1}";
  Spec dyn = plain;
  dyn.precision = "{dtype: fp32, loss_scale: dynamic, init_scale: 256}";
  auto rp = run(plain), r1 = run(one), rd = run(dyn);
  CHECK(rp[0].scale == std::vector<double>(6, 1.0));  // off: loss_scale() is 1
  CHECK(rp[0].extra.empty());                         // off: no scaler state
  CHECK(max_abs_diff(rp[0].params, r1[0].params) == 0.0);
  CHECK(max_abs_diff(rp[0].params, rd[0].params) <= 1e-7);
  CHECK(rd[0].scale == std::vector<double>(6, 256.0));
}

TEST_CASE("bf16 model with fp32 masters tracks the fp32 model closely") {
  // Same data and initial weights (rounded to bf16): after 6 SGD steps the
  // bf16 model differs from fp32 only by bf16 rounding (~2^-8 relative).
  Spec f32;
  f32.dtype = at::kFloat;
  Spec b16;
  b16.precision = "{dtype: bf16}";
  auto rf = run(f32), rb = run(b16);
  CHECK(rb[0].scale == std::vector<double>(6, 65536.0));
  const double d = max_abs_diff(rf[0].params, rb[0].params);
  MESSAGE("max |fp32 - bf16| parameter difference after 6 steps: " << d);
  CHECK(d > 0.0);
  // bf16 rounding of weights, activations and gradients, deterministic for
  // this data (measured: 0.0038 on every kernel set).
  CHECK(d < 0.01);
}

TEST_CASE("bf16: the fp32 masters follow mixed precision done by hand; the model is them rounded") {
  Spec b16;
  b16.precision = "{dtype: bf16}";
  auto rb = run(b16);
  const std::vector<double> ref = bf16_reference(b16.steps);
  REQUIRE(rb[0].scale == std::vector<double>(6, 65536.0));  // no step skipped
  for (int k = 0; k < 2; ++k) {
    CAPTURE(k);
    REQUIRE(rb[k].masters.size() == ref.size());
    const double d = max_abs_diff(rb[k].masters, ref);
    MESSAGE("rank " << k << ": max |masters - reference| = " << d);
    // The same fp32 operations in the same order (measured: bitwise equal); masters
    // refreshed from the bf16 model, or the unscale or average skipped, are
    // off by bf16's rounding (1e-3) or more.
    CHECK(d <= 1e-6);
    CHECK(rb[k].model_vs_masters == std::vector<double>{0.0});  // model = bf16(masters)
    // The masters keep what bf16 rounds away (else they would be pointless).
    CHECK(max_abs_diff(rb[k].masters, rb[k].params) > 0.0);
  }
}
