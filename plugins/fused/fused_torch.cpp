#include "fused_torch.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include <cmath>

// PyTorch's fused optimizer kernels: CUDA since 2.0 (_fused_sgd_ 2.2), CPU
// since 2.4. One threshold keeps the two devices on the same code.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define DISTOPT_FUSED_TORCH_KERNELS 1
#else
#define DISTOPT_FUSED_TORCH_KERNELS 0
#endif

namespace distopt::plugins::fused {

bool torch_fused_kernels() { return DISTOPT_FUSED_TORCH_KERNELS != 0; }

#if DISTOPT_FUSED_TORCH_KERNELS

void sgd_step_torch(TensorChunk& c, const SgdHyper& h) {
  at::NoGradGuard ng;
  // momentum 0: no buffer list (the kernels check that it is empty).
  const std::vector<at::Tensor> none;
  at::_fused_sgd_(c.params, c.grads, h.momentum != 0 ? c.state0 : none, h.weight_decay, h.momentum,
                  h.lr, h.dampening, h.nesterov, /*maximize=*/false, h.first);
}

void adam_step_torch(TensorChunk& c, const AdamHyper& h) {
  at::NoGradGuard ng;
  c.step.fill_(static_cast<double>(h.step));  // read by the kernel, as torch.optim's state["step"]
  const std::vector<at::Tensor> steps(c.params.size(), c.step);
  const std::vector<at::Tensor> none;
  const std::vector<at::Tensor>& vmax = h.amsgrad ? c.state2 : none;
  if (h.decoupled)
    at::_fused_adamw_(c.params, c.grads, c.state0, c.state1, vmax, steps, h.lr, h.beta1, h.beta2,
                      h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false);
  else
    at::_fused_adam_(c.params, c.grads, c.state0, c.state1, vmax, steps, h.lr, h.beta1, h.beta2,
                     h.weight_decay, h.eps, h.amsgrad, /*maximize=*/false);
}

#else  // _foreach_ formulation (torch.optim's foreach=True), libtorch < 2.4

void sgd_step_torch(TensorChunk& c, const SgdHyper& h) {
  at::NoGradGuard ng;
  // d = g + wd * p (a new list: the gradients are the reducer's, only read)
  std::vector<at::Tensor> d =
      h.weight_decay != 0 ? at::_foreach_add(c.grads, c.params, h.weight_decay) : c.grads;
  if (h.momentum != 0) {
    if (h.first) {
      for (size_t k = 0; k < d.size(); ++k) c.state0[k].copy_(d[k]);
    } else {
      at::_foreach_mul_(c.state0, h.momentum);
      at::_foreach_add_(c.state0, d, 1 - h.dampening);
    }
    if (h.nesterov)
      d = at::_foreach_add(d, c.state0, h.momentum);
    else
      d = c.state0;
  }
  at::_foreach_add_(c.params, d, -h.lr);
}

void adam_step_torch(TensorChunk& c, const AdamHyper& h) {
  at::NoGradGuard ng;
  c.step.fill_(static_cast<double>(h.step));
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  if (h.decoupled && h.weight_decay != 0) at::_foreach_mul_(c.params, 1 - h.lr * h.weight_decay);
  const std::vector<at::Tensor> g = !h.decoupled && h.weight_decay != 0
                                        ? at::_foreach_add(c.grads, c.params, h.weight_decay)
                                        : c.grads;
  at::_foreach_mul_(c.state0, h.beta1);
  at::_foreach_add_(c.state0, g, 1 - h.beta1);
  at::_foreach_mul_(c.state1, h.beta2);
  at::_foreach_addcmul_(c.state1, g, g, 1 - h.beta2);
  if (h.amsgrad) at::_foreach_maximum_(c.state2, c.state1);
  // denom = sqrt(v) / sqrt(bc2) + eps; p += -(lr / bc1) * m / denom
  std::vector<at::Tensor> denom = at::_foreach_sqrt(h.amsgrad ? c.state2 : c.state1);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, h.eps);
  at::_foreach_addcdiv_(c.params, c.state0, denom, -(h.lr / bc1));
}

#endif

}  // namespace distopt::plugins::fused
