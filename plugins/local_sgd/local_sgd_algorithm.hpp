// The `local_sgd` algorithm: post-local SGD (Lin et al., "Don't Use Large
// Mini-Batches, Use Local SGD", ICLR 2020), as PyTorch's
// PostLocalSGDOptimizer + PeriodicModelAverager with the post_localSGD_hook.
//
// The rule. Steps are numbered s = 0, 1, 2, ... (steps this algorithm has
// taken, checkpointed); W is the world size.
//   s <  warmup_steps: warm-up step, as `allreduce`: every gradient bucket is
//                      reduced through the configured reducer during
//                      backward, then the inner optimizer steps (every rank
//                      the same).
//   s >= warmup_steps: local step k = s - warmup_steps + 1 (k = 1, 2, ...):
//                      the inner optimizer steps with this rank's own
//                      gradient (the reducer is not used); then, when
//                      k % period == 0, every parameter is replaced by its
//                      mean over the ranks (allreduce SUM, then / W, one
//                      allreduce per bucket).
// So the parameters are averaged after steps warmup_steps + period - 1,
// warmup_steps + 2 period - 1, ...: after every period-th local step.
// PyTorch's PeriodicModelAverager averages after step s when s >= warmup_steps
// and (s - warmup_steps) % period == 0, i.e. after local steps 1, period + 1,
// 2 period + 1, ...: ours is its schedule shifted by period - 1 steps (the
// same schedule for period 1). With period 1 and plain SGD the mean of the
// ranks' x - lr g_i is x - lr mean(g_i): `allreduce`, up to rounding.
//
// The inner optimizer's state (momentum, Adam moments) stays local: it is
// never averaged, as in PyTorch.
//
// Checkpoints (ABI 1.2 trait DOPT_TRAIT_LOCAL_REPLICAS; sdk::save_local_replica):
// every rank's own replica and optimizer state (RANK_LOCAL), rank 0's
// optimizer state under the usual optimizer/... keys, and the step counter s
// (local_sgd/step), so a resume continues every rank bitwise and neither
// repeats the warm-up nor shifts the averaging steps (PyTorch's averager
// restarted its counter: pytorch/pytorch issue 74556). On another world size
// every rank starts from the mean of the saved replicas (warned).
//
// Metrics: local_sgd.warmup_steps, local_sgd.local_steps, local_sgd.averages
// (counts) and local_sgd.wait_seconds (time in the parameter averaging).
#pragma once

#include <cstdint>
#include <vector>

#include "distopt/sdk/optim/whole_params.hpp"
#include "distopt/sdk/sdk.hpp"
#include "parameter_average.hpp"

namespace distopt::plugins::local_sgd {

class LocalSgdAlgorithm : public sdk::Algorithm {
 public:
  /// ABI 1.4 devices: only libtorch tensor ops (the inner optimizer, packing and
  /// averaging bucket-shaped buffers): any device (CUDA: world size 1 on an H200, STATUS.md).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  static constexpr uint32_t traits = DOPT_TRAIT_LOCAL_REPLICAS;
  /// Refuses mixed precision (UNSUPPORTED) and, with warmup_steps 0, a
  /// reducer that is not the exact mean (it would never run).
  static void check_job(const sdk::JobView& job);

  explicit LocalSgdAlgorithm(const dopt_algorithm_args& args);
  ~LocalSgdAlgorithm() override;
  void on_bucket_ready(const dopt_bucket& bucket) override;
  void step() override;
  void set_lr(int32_t group, double lr) override;
  /// ABI 1.5: no global gradient exists, so each rank clips its own
  /// gradient by its own norm (no communication).
  void set_grad_clip(double max_norm) override;
  uint64_t state_bytes() const override;
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;
  /// Bytes of the parameter averaging; the reducer counts the warm-up's.
  uint64_t bytes_sent() const override { return bytes_; }

 private:
  bool warming_up() const { return step_ < warmup_; }
  void finish_reductions();
  void average();

  sdk::ReducerView reducer_;
  sdk::CommView comm_;
  int32_t rank_;
  int32_t world_size_;
  int64_t warmup_;
  int64_t period_;
  int64_t step_ = 0;                        // s: steps taken
  std::vector<sdk::ReduceHandle> pending_;  // per bucket, a warm-up step's reduction
  /// optimizer.grad_clip on this rank's gradient, then one step of params_.
  void clip_and_step();
  double grad_clip_ = 0;     // optimizer.grad_clip (0 = off)
  sdk::WholeParams params_;  // this rank's replica and its inner optimizer
  ParameterAverage average_;
  uint64_t bytes_ = 0;
};

}  // namespace distopt::plugins::local_sgd
