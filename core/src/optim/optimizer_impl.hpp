// Private: the state behind a DistributedOptimizer (shared by its methods
// and by the checkpoint code, which saves and restores it).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/services.hpp"
#include "distopt/algorithm.h"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/reducer.h"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/bucket_manager.hpp"
#include "optim/master_weights.hpp"
#include "optim/optimizer_builder.hpp"
#include "optim/param_shards.hpp"

namespace distopt {

struct DistributedOptimizer::Impl {
  optim::OptimizerBuild build;
  std::unique_ptr<optim::BucketManager> buckets;
  std::deque<sdk::DLView> views;  // DLTensors of parameters and gradients (stable addresses)
  std::vector<dopt_param> params;
  std::vector<dopt_param_group> groups;
  std::string reducer_scope, algorithm_scope;
  dopt_create_args reducer_args{}, algorithm_common{};
  dopt_algorithm_args algorithm_args{};
  const dopt_reducer_v1* rvt = nullptr;
  dopt_reducer* reducer = nullptr;
  const dopt_algorithm_v1* avt = nullptr;
  dopt_algorithm* algorithm = nullptr;
  std::string reducer_who, algorithm_who;
  std::string watched_as;  // "ALG' with reducer 'RED": how the watchdog names the algorithm
  int world_size = 1;
  int64_t steps = 0;
  int64_t epoch = 0;           // the last set_epoch (schedule bounds)
  std::vector<double> lr_set;  // per group: the last set_lr (-1 = the config's), checkpointed
  /// Group g's base learning rate: the last set_lr, else the group's lr,
  /// else the optimizer's `lr`. The schedule scales it.
  double base_lr(size_t g) const;
  /// With a schedule: set every group's lr to base x factor(steps) in the
  /// algorithm (the start of each step()).
  void apply_lr_schedule();
  /// ABI 1.5: hand build.grad_clip to the algorithm (after create). Throws
  /// ConfigError naming the algorithm and its plugin file when it has no
  /// set_grad_clip; ComponentError when it refuses.
  void apply_grad_clip();
  uint64_t plain_bytes_per_step = 0;
  // Totals of the optimizers this one replaced (add_param_group rebuilds the
  // reducer, whose own counter starts again at 0).
  uint64_t bytes_sent_base = 0;
  /// What the reducer and (ABI 1.1) the algorithm itself have sent.
  uint64_t components_bytes_sent() const {
    uint64_t n = rvt->bytes_sent(reducer);
    if (DOPT_HAS_FIELD(avt, dopt_algorithm_v1, bytes_sent) && avt->bytes_sent)
      n += avt->bytes_sent(algorithm);
    return n;
  }
  uint64_t plain_bytes_base = 0;  // plain-allreduce bytes of steps [0, plain_steps_base)
  int64_t plain_steps_base = 0;
  // A bucket went to the algorithm since the last step() (set on the autograd
  // thread): its reduction may be in flight, so the optimizer cannot be rebuilt.
  std::atomic<bool> launched{false};
  // Parameter sharding (algorithm.h ABI 1.7; null when the algorithm
  // shards nothing or the model has no units).
  std::shared_ptr<optim::ParamShards> shards;
  std::vector<int32_t> bucket_sharded;  // per bucket: 1 when its unit is sharded
  std::vector<int> shard_of_bucket;     // per bucket: index in shards, or -1
  // Mixed precision (null / unused when off).
  std::unique_ptr<optim::MasterWeights> masters;
  std::unique_ptr<LossScaler> scaler;

  const dopt_bucket* algorithm_buckets() const {
    return masters ? masters->buckets() : buckets->buckets();
  }
  uint64_t algorithm_bucket_bytes(size_t b) const {
    return masters ? masters->bucket_bytes(b) : buckets->bucket_bytes(b);
  }
  /// Hand a complete bucket to the algorithm (autograd thread, or step()):
  /// first this step's join count, then the join scaling of the gradients.
  void launch(const dopt_bucket& bucket);
  /// Mixed precision with parameter sharding (autograd thread, or finish()):
  /// low-precision bucket `bucket` unscaled into its fp32 bucket, which goes
  /// to the algorithm at once (the inf/NaN check comes at step()).
  void launch_unscaled(const dopt_bucket& bucket);
  /// Parameter sharding: bucket k's full gradients (and their fp32 copy) go,
  /// when it is a unit's.
  void release_unit_bucket(size_t k);
  /// Parameter sharding, before a unit's bucket gets memory (autograd
  /// thread): buckets 0..handed-1 went to the algorithm this step; when its
  /// finish_buckets (ABI 1.9) says it is done with them, they go.
  void finish_handed_units(size_t handed);
  /// Bytes of units' full gradients present now (buckets and fp32 copies).
  uint64_t unit_grad_bytes() const;
  /// Raise peak_unit_grads to unit_grad_bytes() (autograd or training thread).
  void note_unit_grads();
  std::atomic<uint64_t> peak_unit_grads{0};
  /// Parameter sharding, after step() or discard_step(): every unit's
  /// gradients go, and the forward order becomes the prefetch order.
  void end_sharded_step();

  // Join (uneven inputs, DistributedOptimizer::join). Each step starts with
  // one SUM allreduce of "1 if this rank has not joined".
  std::atomic<bool> join_notified{false};  // this step's count is done
  bool joined = false;                     // inside join(): shadowing the others' steps
  double grad_scale = 1;                   // world / ranks that contributed this step
  /// Allreduce `mine` (1 = still stepping, 0 = joined); the ranks not joined.
  int count_ranks_not_joined(bool mine);
  /// This step's join count, once (no-op when join is off or on 1 rank).
  void ensure_join_notified();
  /// `value` reduced with `op` over the ranks (blocking; `what` names it in
  /// errors). The host's own control values: the inf/NaN flag, the join count.
  float allreduce_scalar(float value, dopt_reduce_op op, const char* what);
  /// The same for `n` floats in place, one collective.
  void allreduce_floats(float* values, int64_t n, dopt_reduce_op op, const char* what);
  bool any_rank_found_inf(bool mine);
  void mixed_precision_step();
  /// build.buffers->sync() with metrics; nothing if no buffers were set.
  void sync_buffers();
  /// After the first step: warn (rank 0) if the reducer sent nothing on
  /// several ranks, i.e. the algorithm reduced the gradients itself (zero
  /// stage 2) and the configured reducer's semantics did not apply.
  void check_reducer_used();
  bool reducer_use_checked = false;

  ~Impl() {
    // Hooks first (backward must not reach a destroyed algorithm), then the
    // algorithm, which borrows the reducer.
    if (buckets) buckets->detach();
    shards.reset();  // the units forward without gathering from now on
    if (algorithm && avt) avt->destroy(algorithm);
    if (reducer && rvt) rvt->destroy(reducer);
    take_last_error();
  }
};

namespace optim {
struct Access {
  static DistributedOptimizer::Impl& of(DistributedOptimizer& o) { return *o.impl_; }
  static std::unique_ptr<DistributedOptimizer::Impl>& ptr(DistributedOptimizer& o) {
    return o.impl_;
  }
};
/// After a step or set_epoch: switch to the schedule phase whose
/// predecessors' bounds are reached (switching.cpp). Collective then.
void advance_schedule(DistributedOptimizer& opt);
}  // namespace optim

}  // namespace distopt
