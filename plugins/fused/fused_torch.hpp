// The `fused` algorithm's device-generic update: the same SGD / Adam / AdamW
// rules as fused_kernels.hpp, written on libtorch's multi-tensor ops over
// lists of tensors (one entry per Segment), so that they run on any device
// libtorch has kernels for (CUDA included) and on CPU tensors for the tests.
//
// Which ops (chosen at compile time from torch/version.h):
//   libtorch >= 2.4: PyTorch's fused kernels at::_fused_sgd_ / _fused_adam_ /
//                    _fused_adamw_ (CUDA since 2.0-2.2, CPU since 2.4), the
//                    kernels behind torch.optim's fused=True: one launch per
//                    list (chunked by multi_tensor_apply), reading each
//                    element once.
//   older:           at::_foreach_* ops (torch.optim's foreach=True
//                    formulation): the same update, one list op per term.
// Both compute in fp32 with scalars rounded to float, the order of libtorch's
// optimizers; results equal fused_kernels.hpp's and torch::optim's up to float
// rounding (tests/fused checks 1e-6 after 20 steps). Neither synchronizes
// with the device: the ops are enqueued on the current stream.
// Thread safety: one call per TensorChunk at a time.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "fused_kernels.hpp"

namespace distopt::plugins::fused {

/// A Chunk as tensor lists. Every list has one entry per segment (1-D fp32
/// tensors, all on one device, entry k of every list the same numel), state
/// lists empty when the optimizer keeps none of that kind (state0: momentum
/// buffer or exp_avg; state1: exp_avg_sq; state2: max_exp_avg_sq). `step`
/// is a float32 scalar tensor on the same device: the fused Adam kernels
/// read the step from it (adam_step_torch fills it); unused for SGD.
struct TensorChunk {
  std::vector<at::Tensor> params, grads, state0, state1, state2;
  at::Tensor step;
};

/// Whether this build calls PyTorch's fused kernels (libtorch >= 2.4) rather
/// than the _foreach_ formulation.
bool torch_fused_kernels();

/// One SGD step over the chunk (h as sgd_step's). params and state0 are
/// updated in place; grads are only read.
void sgd_step_torch(TensorChunk& c, const SgdHyper& h);
/// One Adam / AdamW step (h as adam_step's; h.step >= 1). params and state
/// are updated in place, grads only read; c.step is set to h.step.
void adam_step_torch(TensorChunk& c, const AdamHyper& h);

}  // namespace distopt::plugins::fused
