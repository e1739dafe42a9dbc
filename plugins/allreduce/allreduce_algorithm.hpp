// The `allreduce` algorithm, after mlbench's CentralizedSGD / CentralizedAdam
// and CustomCentralizedOptimizer: every rank reduces every gradient bucket
// (through the configured reducer), optionally clips the global gradient
// norm, and runs the same inner optimizer on the full, replicated parameters.
//
// Options:
//   grad_clip      deprecated alias of the job's optimizer.grad_clip (which
//                  wins when set): max global L2 norm of the reduced
//                  gradients (0 = off); clip_grad_norm_ semantics.
//   average_world  true: gradients are the mean over ranks; false: the sum.
//   divide_before  scale local gradients by 1/W before handing a bucket to
//                  the reducer and undo it after. The reducer averages
//                  (reducer.h), so the result is the same mean (or sum) up to
//                  rounding; what changes is the range of the reducer's
//                  intermediate sums (mlbench does this for fp16 buckets, to
//                  avoid overflow), at the price of underflow for tiny values.
//
// Checkpoints (ABI 1.1): the inner optimizer's state under
// optimizer/<param>/<field> (distopt/state.h), whole tensors. Every rank holds
// the same state, so rank 0 alone puts it; on load every rank reads it whole.
// The keys are those `zero` and `fused` use: checkpoints move between them.
#pragma once

#include <memory>
#include <vector>

#include "distopt/sdk/optim/whole_params.hpp"
#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::allreduce {

class AllreduceAlgorithm : public sdk::Algorithm {
 public:
  /// ABI 1.4 devices: only libtorch tensor ops on the host's descriptors (the inner optimizer,
  /// clipping, scaling): any device libtorch runs (CUDA: world size 1 on an H200).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  explicit AllreduceAlgorithm(const dopt_algorithm_args& args);
  void on_bucket_ready(const dopt_bucket& bucket) override;
  void step() override;
  void set_lr(int32_t group, double lr) override;
  void set_grad_clip(double max_norm) override;
  uint64_t state_bytes() const override;
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;

 private:
  size_t bucket_slot(const dopt_bucket& bucket) const;

  sdk::ReducerView reducer_;
  int32_t rank_;
  int32_t world_size_;
  double grad_clip_;               // the deprecated option
  double host_grad_clip_ = 0;      // optimizer.grad_clip (set_grad_clip)
  std::vector<at::Tensor> grads_;  // trainable gradients (bucket views), what is clipped
  bool average_world_;
  bool divide_before_;
  std::vector<const dopt_bucket*> buckets_;
  std::vector<at::Tensor> flats_;           // per bucket, aliasing the host's flat buffers
  std::vector<sdk::ReduceHandle> pending_;  // per bucket, this step's reduction
  sdk::WholeParams params_;                 // the inner optimizer over whole parameters
};

}  // namespace distopt::plugins::allreduce
