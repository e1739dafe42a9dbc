// The `fused` update codes against each other and against torch::optim,
// single process: fused_torch.hpp (the device path: libtorch multi-tensor
// ops, here on CPU tensors) and fused_kernels.hpp (the host loops) over the
// same chunk of several segments, 30 steps of SGD (plain, momentum,
// dampening, nesterov, weight decay) and Adam / AdamW (weight decay,
// amsgrad), with a new gradient every step; each ends within float
// rounding of libtorch's own optimizer run on the same tensors (measured
// 1.4e-6 on parameters of a few units; bound 1e-5).
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "fused_kernels.hpp"
#include "fused_torch.hpp"
#include "torch_doctest.hpp"

using namespace distopt::plugins::fused;

namespace {

constexpr int kSteps = 30;
const std::vector<int64_t> kSizes = {5, 300, 1, 4097};  // segments of one chunk

// Largest |a - b| over the lists, infinite for a non-finite value.
double diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double m = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!a[k].isfinite().all().item<bool>() || !b[k].isfinite().all().item<bool>()) return INFINITY;
    m = std::max(m, (a[k] - b[k]).abs().max().item<double>());
  }
  return m;
}

// One chunk's storage: parameters and gradients in separate buffers (one
// segment per size), state flat over the chunk.
struct Setup {
  at::Tensor params, grads, state[3];
  Chunk chunk;
  TensorChunk tensors;
  std::vector<at::Tensor> param_views, grad_views;

  explicit Setup(int nstate) {
    int64_t total = 0;
    for (int64_t n : kSizes) total += n;
    at::manual_seed(11);
    params = at::randn({total});
    grads = at::zeros({total});
    for (int k = 0; k < nstate; ++k) state[k] = at::zeros({total});
    chunk.total = total;
    chunk.state0 = nstate > 0 ? state[0].data_ptr<float>() : nullptr;
    chunk.state1 = nstate > 1 ? state[1].data_ptr<float>() : nullptr;
    chunk.state2 = nstate > 2 ? state[2].data_ptr<float>() : nullptr;
    int64_t off = 0;
    std::vector<at::Tensor>* lists[3] = {&tensors.state0, &tensors.state1, &tensors.state2};
    for (int64_t n : kSizes) {
      chunk.segments.push_back(
          {params.data_ptr<float>() + off, grads.data_ptr<float>() + off, n, off});
      param_views.push_back(params.narrow(0, off, n));
      grad_views.push_back(grads.narrow(0, off, n));
      for (int k = 0; k < nstate; ++k) lists[k]->push_back(state[k].narrow(0, off, n));
      off += n;
    }
    tensors.params = param_views;
    tensors.grads = grad_views;
    tensors.step = at::zeros({});
  }
  void set_grad(int step) {
    at::manual_seed(100 + step);
    grads.copy_(at::randn_like(grads));
  }
};

// libtorch's optimizer on copies of the starting parameters, same gradients.
std::vector<at::Tensor> reference(
    const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>& make) {
  Setup s(0);
  std::vector<at::Tensor> ps;
  for (const at::Tensor& p : s.param_views) ps.push_back(p.clone().requires_grad_(true));
  auto opt = make(ps);
  for (int t = 0; t < kSteps; ++t) {
    s.set_grad(t);
    for (size_t k = 0; k < ps.size(); ++k) ps[k].mutable_grad() = s.grad_views[k].clone();
    opt->step();
  }
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : ps) out.push_back(p.detach());
  return out;
}

void check_sgd(double lr, double momentum, double dampening, double wd, bool nesterov) {
  CAPTURE(momentum);
  CAPTURE(dampening);
  CAPTURE(wd);
  CAPTURE(nesterov);
  const int nstate = momentum != 0 ? 1 : 0;
  Setup host(nstate), dev(nstate);
  for (int t = 0; t < kSteps; ++t) {
    const SgdHyper h{lr, momentum, dampening, wd, nesterov, t == 0};
    host.set_grad(t);
    dev.set_grad(t);
    sgd_step(host.chunk, h);
    sgd_step_torch(dev.tensors, h);
  }
  const auto ref = reference([&](std::vector<at::Tensor> ps) {
    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(lr)
                                                       .momentum(momentum)
                                                       .dampening(dampening)
                                                       .weight_decay(wd)
                                                       .nesterov(nesterov));
  });
  CHECK(diff(dev.param_views, host.param_views) <= 1e-5);
  CHECK(diff(dev.param_views, ref) <= 1e-5);
  CHECK(diff(host.param_views, ref) <= 1e-5);
  CHECK(diff(ref, Setup(0).param_views) > 1e-2);  // the steps moved the parameters
}

void check_adam(bool decoupled, double wd, bool amsgrad) {
  CAPTURE(decoupled);
  CAPTURE(wd);
  CAPTURE(amsgrad);
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const int nstate = amsgrad ? 3 : 2;
  Setup host(nstate), dev(nstate);
  for (int t = 0; t < kSteps; ++t) {
    const AdamHyper h{lr, b1, b2, eps, wd, amsgrad, decoupled, t + 1};
    host.set_grad(t);
    dev.set_grad(t);
    adam_step(host.chunk, h);
    adam_step_torch(dev.tensors, h);
  }
  CHECK(dev.tensors.step.item<double>() == kSteps);
  const auto ref =
      reference([&](std::vector<at::Tensor> ps) -> std::unique_ptr<torch::optim::Optimizer> {
        if (decoupled)
          return std::make_unique<torch::optim::AdamW>(
              ps, torch::optim::AdamWOptions(lr).weight_decay(wd).amsgrad(amsgrad));
        return std::make_unique<torch::optim::Adam>(
            ps, torch::optim::AdamOptions(lr).weight_decay(wd).amsgrad(amsgrad));
      });
  CHECK(diff(dev.param_views, host.param_views) <= 1e-5);
  CHECK(diff(dev.param_views, ref) <= 1e-5);
  CHECK(diff(host.param_views, ref) <= 1e-5);
  CHECK(diff({dev.state[1]}, {host.state[1]}) <= 1e-6);  // exp_avg_sq agrees too
  CHECK(diff(ref, Setup(0).param_views) > 1e-2);
}

}  // namespace

TEST_CASE("SGD: the torch update equals the host loops and torch::optim::SGD") {
  check_sgd(0.05, 0, 0, 0, false);
  check_sgd(0.05, 0, 0, 0.01, false);
  check_sgd(0.05, 0.9, 0, 0.01, false);
  check_sgd(0.05, 0.9, 0.3, 0, false);
  check_sgd(0.05, 0.9, 0, 0.01, true);
}

TEST_CASE("Adam and AdamW: the torch update equals the host loops and torch::optim") {
  check_adam(false, 0, false);
  check_adam(false, 0.01, true);
  check_adam(true, 0.1, false);
  check_adam(true, 0.1, true);
}
