// The `fused` algorithm, after Bagua's fuse_optimizer (reference
// 000_e318cde4c1d95ba8: `do_flatten`, `check_flatten`): gradients are reduced
// bucket by bucket like `allreduce` (the reducer reduces the host's flat
// gradient buckets in place: no extra copy), then the inner optimizer runs
// ONCE per parameter group as a single fused pass instead of libtorch's
// per-tensor sequence of ops.
//
// Memory layout (why there is no parameter copy): the host owns parameter
// memory and its DLTensor addresses are fixed, so parameters cannot become
// views into a plugin buffer as in Bagua. Copying them into a flat master
// buffer and back would add 16 bytes of traffic per element and step to
// Adam's 28. Instead the plugin flattens the group's optimizer STATE, laid out
// in the gradient buckets' order (bucket by bucket, entry by entry), and its
// kernel walks (parameter, gradient-in-bucket, state) segments: one parallel
// pass per group, parameters updated in place, gradients read from the
// reduced buckets, exact (same fp32 update as libtorch).
//
// Options (plugin.cpp's schema):
//   do_flatten     true: one state buffer and one fused pass per param group.
//                  false: fuse only runs of parameters already contiguous in
//                  memory (parameter AND gradient adjacent, same group); each
//                  run is its own pass.
//   check_flatten  before each step compare each parameter's data pointer,
//                  numel and dtype with the snapshot taken at flattening. A
//                  moved parameter (the host re-points its descriptor after
//                  user code replaced `.data`) is re-flattened with a
//                  warning, keeping its optimizer state; a changed numel or
//                  dtype is an error (its state cannot be mapped).
//   kernels        which update code runs: `host` (fused_kernels.hpp: one
//                  parallel CPU loop per chunk over raw pointers; CPU
//                  parameters only), `torch` (fused_torch.hpp: libtorch's
//                  multi-tensor ops, PyTorch's _fused_adam_ / _fused_sgd_
//                  where libtorch has them; any device), `auto` (default:
//                  host for CPU parameters, where it is the faster, torch
//                  for the others). `torch` on CPU is how the tests run the
//                  device path without a GPU.
// Inner optimizers: sgd (momentum, dampening, nesterov, weight_decay),
// adam, adamw (amsgrad, weight_decay); fp32 parameters, all on one device
// (CPU or CUDA), the buckets on the same. Others are refused at create with
// UNSUPPORTED (use `allreduce`).
// Device memory: the optimizer state lives on the parameters' device; the
// update is enqueued on the current stream of the thread that calls step()
// (no host synchronization), after the reducer's requests were waited for.
// Checkpoints (ABI 1.1): the flat state is put per parameter under the keys
// libtorch's optimizers use (optimizer/<param>/momentum_buffer for sgd;
// step, exp_avg, exp_avg_sq, max_exp_avg_sq for adam / adamw; state.h), as
// whole tensors by rank 0 (every rank holds the same), so `fused`,
// `allreduce` and `zero` checkpoints load into each other. The plugin keeps
// one step counter per param group (a group added by add_param_group starts
// at 0, as libtorch's new parameters do): it is put as each parameter's
// int64 scalar `step`; on load the steps within a group must agree. SGD
// keeps no step (libtorch's SGD neither): a loaded momentum_buffer means "not
// the first step".
// Thread safety: on_bucket_ready may run on the autograd thread; step,
// set_lr, state_bytes on the training thread, never concurrently with a step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distopt/sdk/sdk.hpp"
#include "fused_kernels.hpp"
#include "fused_torch.hpp"

namespace distopt::plugins::fused {

class FusedAlgorithm : public sdk::Algorithm {
 public:
  /// ABI 1.4 devices: host memory (the host loops or libtorch ops) and CUDA
  /// memory (libtorch ops, kernels: auto or torch; trained on CUDA at world
  /// size 1 on an H200, STATUS.md; the CPU tests run the same code).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  explicit FusedAlgorithm(const dopt_algorithm_args& args);
  void on_bucket_ready(const dopt_bucket& bucket) override;
  void step() override;
  void set_lr(int32_t group, double lr) override;
  /// ABI 1.5: replicated gradients, clipped before the fused update.
  void set_grad_clip(double max_norm) override;
  uint64_t state_bytes() const override;
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;

 private:
  struct Slot {  // one trainable parameter
    const dopt_param* param;
    const float* grad;  // into its bucket
    int64_t numel;
    int32_t group;
    int64_t state_offset;  // into its group's state buffers
    void* snapshot;        // data pointer when flattened
  };
  struct Group {
    double lr, weight_decay;
    int64_t steps = 0;     // steps taken with state (0: no state yet)
    int64_t elements = 0;  // trainable elements (the buffers also hold alignment gaps)
    at::Tensor state[3];   // flat fp32 on device_ (undefined when not kept)
    at::Tensor step;       // fp32 scalar on device_ (the torch kernels' step)
  };
  struct FusedChunk {
    int32_t group;
    int64_t base = 0;            // offset of the chunk's state in its group's buffers
    fused::Chunk chunk;          // kernels host: raw pointers
    fused::TensorChunk tensors;  // kernels torch: the same segments as tensors
  };

  void flatten();         // (re)build chunks_ from slots_ (state kept)
  bool layout_changed();  // check_flatten's test
  void run_optimizer();
  // (field name, state buffer index) of what this optimizer keeps per element.
  std::vector<std::pair<const char*, int>> state_fields() const;
  /// The slot's elements of state buffer `index` (a view on device_).
  at::Tensor state_of(const Slot& s, int index);
  /// fc.tensors from fc.chunk's segments (kernels torch).
  void build_tensors(FusedChunk& fc);

  sdk::ReducerView reducer_;
  int32_t rank_;
  int32_t world_size_;
  bool do_flatten_, check_flatten_;
  std::string optimizer_;
  double momentum_ = 0, dampening_ = 0, beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8;
  bool nesterov_ = false, amsgrad_ = false;
  bool torch_ = false;  // run fused_torch.hpp's update (kernels torch, or auto off the CPU)
  at::Device device_{at::kCPU};
  std::vector<const dopt_bucket*> buckets_;
  std::vector<sdk::ReduceHandle> pending_;
  std::vector<Slot> slots_;  // in bucket layout order
  std::vector<Group> groups_;
  std::vector<FusedChunk> chunks_;
  uint64_t reflattens_ = 0;
  double grad_clip_ = 0;           // optimizer.grad_clip (0 = off)
  std::vector<at::Tensor> grads_;  // trainable gradients (bucket views), what is clipped
};

}  // namespace distopt::plugins::fused
