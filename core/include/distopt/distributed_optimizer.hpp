// The optimizer an application steps: gradient buckets + reducer + algorithm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "distopt/precision.hpp"

namespace at {
class Tensor;  // <ATen/ATen.h>; callers of scale_loss include it
}

namespace distopt {

namespace optim {
struct Access;  // core-internal access to the state (checkpoints)
}

/// Made by Runtime::make_optimizer. Movable, not copyable. Not thread-safe:
/// call zero_grad / step from the training thread, after backward returns.
class DistributedOptimizer {
 public:
  struct Impl;
  explicit DistributedOptimizer(std::unique_ptr<Impl> impl);
  DistributedOptimizer(DistributedOptimizer&&) noexcept;
  DistributedOptimizer& operator=(DistributedOptimizer&&) noexcept;
  ~DistributedOptimizer();

  /// Zero every gradient (they are views into the buckets; never set to None).
  void zero_grad();
  /// Finish reducing the gradients of the last backward and run the
  /// algorithm's step. Collective. Throws CommError / ComponentError.
  void step();
  /// Set the learning rate of parameter group `group`.
  void set_lr(double lr, int group = 0);

  /// Bytes of optimizer state on this rank.
  uint64_t state_bytes() const;
  /// Bytes the reducer put on the wire from this rank since creation.
  uint64_t bytes_sent() const;
  /// Bytes a plain allreduce of the same buckets would have put on the wire.
  uint64_t bytes_sent_plain_allreduce() const;
  /// Number of buckets, and steps taken (skipped mixed-precision steps excluded).
  size_t num_buckets() const;
  int64_t steps() const;
  const std::string& algorithm_name() const;

  // ---- Mixed precision (the config's `precision:` section, precision.hpp) ----
  //
  // With bf16/fp16 the application runs its module in that dtype (e.g.
  // module->to(at::kBFloat16) before make_optimizer; `distopt train` does it
  // from the config). The optimizer keeps an fp32 master copy of every
  // low-precision parameter and an fp32 gradient bucket per bucket: the
  // algorithm plugin sees the masters as its parameters and the fp32 buckets
  // as gradients, so every plugin works unchanged. step():
  //   1. upcasts the low-precision gradients into the fp32 buckets and
  //      divides them by loss_scale() (so grad_clip and the inner optimizer
  //      see unscaled gradients);
  //   2. allreduces an inf/NaN flag (MAX) through the communicator: a step
  //      with a non-finite gradient on ANY rank is skipped on every rank
  //      (parameters and optimizer state untouched, steps() not advanced) and
  //      the scale backs off;
  //   3. otherwise hands the buckets to the algorithm and runs its step, then
  //      copies the masters back into the model's parameters.
  // Trade-off: buckets reach the algorithm only in step(), after the finite
  // check, so communication no longer overlaps backward under mixed
  // precision (the skip decision needs every gradient first; GradScaler on
  // DDP instead reduces scaled gradients and checks after the reduction).
  // bytes_sent() / bucket sizes are those of the fp32 buckets.

  /// True when the config enables mixed precision (PrecisionConfig::enabled).
  bool mixed_precision() const;
  /// The dtype the model is meant to compute in (fp32 when off).
  PrecisionDtype compute_dtype() const;
  /// loss x loss_scale() (the input itself when mixed precision is off): call
  /// backward() on this. Any dtype/device; differentiable.
  at::Tensor scale_loss(const at::Tensor& loss) const;
  /// The current loss scale (1 when mixed precision is off).
  double loss_scale() const;
  /// Steps skipped because a gradient was inf/NaN on some rank.
  int64_t skipped_steps() const;
  /// The scaler state for checkpoints (scale, growth tracker, skipped steps),
  /// and its restore (throws distopt::Error for an invalid state). Restoring
  /// must happen on every rank with the same state.
  LossScaleState loss_scale_state() const;
  void set_loss_scale_state(const LossScaleState& s);

 private:
  friend struct optim::Access;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distopt
