// Gradient clipping by the global L2 norm for algorithm plugins (ABI 1.5,
// algorithm.h set_grad_clip): the one implementation every in-tree
// algorithm uses. Torch.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "distopt/algorithm.h"
#include "distopt/sdk/base/comm.hpp"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::sdk {

/// How the gradient tensors given to clip_grad_norm relate across ranks.
enum class GradParts {
  /// Every rank holds the whole reduced gradient (allreduce, fused, hybrid
  /// unsharded): the norm is computed locally, no communication.
  replicated,
  /// Each rank holds the disjoint part it owns (zero, hybrid shard: true):
  /// the squares of each rank's parts are summed over the ranks with one
  /// SUM allreduce of one fp64 scalar.
  sharded,
  /// Each rank has its own gradient and no global one exists
  /// (decentralized, local_sgd): each rank clips its own, no communication.
  per_rank,
};

/// torch::nn::utils::clip_grad_norm_ (L2) over `grads` of all ranks as
/// `parts` says: total = sqrt(sum_i ||g_i||^2) (per tensor norms in the
/// gradients' dtype, combined in fp64 on the first tensor's device), then
/// every g_i *= min(1, max_norm / (total + 1e-6)) in place. For `replicated`
/// and `per_rank` the arithmetic is clip_grad_norm_'s op for op (the norm
/// of the stacked per-tensor norms). `grads`: any dtypes and devices (hybrid
/// passes CPU and device tensors together: the partial sums are added on
/// `device` before the one allreduce); undefined tensors are skipped. For
/// `sharded`, `comm` is the job's communicator and `device` where the scalar
/// is reduced (a device it accepts: the gradients' device); every rank must
/// call it in the same order of its collectives, also a rank that owns
/// nothing (empty `grads`). max_norm <= 0: nothing is clipped, the norm is
/// still returned. Adds the pre-clip total to metric "optimizer.grad_norm"
/// and 1 to "optimizer.grad_norm_steps" (their ratio is the mean). Returns
/// the pre-clip total norm. Throws sdk::Error::reported when the allreduce
/// fails. Training thread (inside step()).
inline double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, GradParts parts,
                             CommView* comm = nullptr, at::Device device = at::kCPU) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> norms;
  for (const at::Tensor& g : grads)
    if (g.defined() && g.numel() > 0) norms.push_back(g.norm(2));
  double total = 0;
  if (parts != GradParts::sharded) {
    if (norms.empty()) return 0;
    // Stacked on one device, as clip_grad_norm_ does (its grads share one).
    const at::Device d = norms.front().device();
    for (auto& n : norms) n = n.to(d);
    at::Tensor t = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
    total = t.item<double>();
  } else {
    at::Tensor sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
    for (const at::Tensor& n : norms) sum.add_(n.to(device, at::kDouble).square());
    if (comm && comm->world_size() > 1) {
      DLView v(sum);
      comm->allreduce(*v.get(), *v.get(), DOPT_REDUCE_SUM).wait();
    }
    total = std::sqrt(sum.item<double>());
  }
  metric_add("optimizer.grad_norm", total);
  metric_add("optimizer.grad_norm_steps", 1);
  if (max_norm <= 0) return total;
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    metric_add("optimizer.grad_clipped_steps", 1);
    for (const at::Tensor& g : grads)
      if (g.defined() && g.numel() > 0) g.mul_(coef);
  }
  return total;
}

/// The gradients of the trainable parameters of `args` (views into the
/// host's buckets), in parameter order: what a replicated or per-rank
/// algorithm clips.
inline std::vector<at::Tensor> trainable_grads(const dopt_algorithm_args& args) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < args.num_params; ++i) {
    const dopt_param& p = args.params[i];
    if (p.requires_grad && p.grad) out.push_back(as_tensor(*p.grad));
  }
  return out;
}

/// Validates a set_grad_clip value: finite and >= 0, else
/// sdk::Error(INVALID_ARGUMENT) naming `component`.
inline double checked_max_norm(double max_norm, const std::string& component) {
  if (!std::isfinite(max_norm) || max_norm < 0)
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                component + ": set_grad_clip: max_norm must be finite and >= 0, got " +
                    std::to_string(max_norm));
  return max_norm;
}

}  // namespace distopt::sdk
