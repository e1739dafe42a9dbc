// The `zero` algorithm: ZeRO stages 1 and 2 (Rajbhandari et al., "ZeRO:
// Memory Optimizations Toward Training Trillion Parameter Models", SC'20),
// with the options of PyTorch's ZeroRedundancyOptimizer
// (torch.distributed.optim.ZeroRedundancyOptimizer).
//
// Stage 1 (optimizer state sharded): every gradient bucket is averaged with
// the job's reducer as soon as it is complete (as `allreduce` does); at step()
// each rank runs the inner optimizer only over what it owns, so it keeps the
// optimizer state (momentum, Adam moments, ...) of 1/W of the parameters;
// then the updated parameters reach every rank: one broadcast per owned
// parameter (or item shard of one) from its owner, or, with
// `parameters_as_bucket_view: true`, one allgather of a buffer into which each
// rank packs its parameters.
//
// Stage 2 (gradients sharded too): each bucket is reduce-scattered (AVG) with
// the communicator as soon as it is complete, during backward, straight into
// this rank's shard of that bucket, so a rank holds the reduced gradients of
// 1/W of the elements only (the host's bucket buffers still hold this rank's
// local, unreduced gradients: the host owns them; a bucket whose length is
// not a multiple of W is sent through a zero-padded copy that lives until
// step()). The job's reducer is not used, so stage 2 accepts only a reducer
// that declares the exact mean (DOPT_TRAIT_EXACT_MEAN, ABI 1.2; in this tree
// `mean`): with any other (fp16, topk, powersgd, ...) its compression,
// scaling or error feedback would silently not apply, and check_job refuses
// the job at `distopt check`, naming algorithm.options.stage. Stage 1 hands
// every bucket to the reducer and takes any. Ownership follows the bucket
// layout: each bucket's flat range is partitioned into W equal shards (padded
// to a multiple of W), whatever `partition` says; parameters may be split
// across ranks, the inner optimizer runs over the owned item shards. Parameters are
// synchronised per bucket (allgather, or one broadcast per item shard when
// parameters_as_bucket_view is false).
//
// Bytes sent: the reducer counts stage 1's gradient allreduce; this
// algorithm counts what it puts on the wire itself (stage 2's
// reduce-scatter, both stages' parameter sync), per rank, as the tcp
// communicator's network path moves it: (W - 1) x shard bytes per ring
// reduce-scatter or allgather; a broadcast (a chain from the owner) sends the
// item shard from every rank but owner - 1. It goes to the job metric
// "algorithm.bytes_sent" and bytes_sent() (ABI 1.1), which
// DistributedOptimizer::bytes_sent() adds to the reducer's, so `distopt
// train` reports both.
//
// Stage 3 (parameters sharded too; algorithm.h "Parameter sharding", ABI
// 1.7): the host plans one bucket per unit of the model (the modules the
// application wrapped in distopt::ShardedUnit) and marks those buckets
// sharded. For such a bucket this rank keeps only its shard of the
// parameters (copied at create from the bucket layout's range [rank x
// shard, (rank + 1) x shard)), reduce-scatters the gradients into its
// gradient shard as stage 2 does, and the inner optimizer steps the
// parameter shard; gather_params allgathers the shards into the host's full
// buffer before the unit's forward and backward. Nothing is synchronised
// after step() for such buckets. Buckets of parameters in no unit are
// handled as stage 2 (allgathered after the step). Bytes per rank and step:
// stage 2's reduce-scatter plus two allgathers of each unit
// (reshard_after_forward: true; one with false). Checkpoints save the
// optimizer state as stage 2 does; the host gathers the parameters to save
// them and, on load, hands the loaded ones to scatter_params.
//
// Stage 3 under mixed precision (ABI 1.8): the parameters the host creates
// this algorithm with are the fp32 masters, so the parameter shards are
// the sharded masters and the gradient buckets are fp32 (unscaled by the
// host); gather_params gets a buffer of the model's dtype (bf16, fp16) and
// allgathers the shard rounded to it. When a rank found an inf/NaN the
// host calls discard_step(): the reduce-scatters already started are
// finished and forgotten, nothing is stepped.
//
// Stage 3 gradient memory (ABI 1.9, finish_buckets): by default a unit's
// reduce-scatter overlaps the next unit's backward up to that unit's first
// gradient, then completes, so the host frees the unit's gradients before
// the next unit's take memory: one unit's full gradients at a time.
// overlap_comm: true keeps it running through the next unit's whole
// backward (DeepSpeed's overlap_comm): two units' gradients at a time.
//
// Partition (stage 1): `greedy` = PyTorch's sorted-greedy over whole
// parameters (state per rank within one largest parameter of 1/W);
// `contiguous` = the trainable parameters laid back to back, partitioned into W
// equal shards (state per rank = 1/W of the whole, up to W - 1 padding
// elements).
// See partition.hpp.
//
// Inner optimizers: every one of the SDK factory (sgd, adam, adamw, adagrad,
// rmsprop) with its param groups (per-group lr and weight decay). All are
// elementwise, so updating item shards gives exactly the unsharded result.
//
// Parameters without a gradient in a step (unused in forward) have a zero
// gradient in their bucket (core's BucketManager) and are stepped with it, as
// by `allreduce`: libtorch would skip them instead (undefined .grad). The
// results agree while such a parameter has no optimizer history (zero
// momentum / moments) and no weight decay; they differ for a parameter that
// was used in earlier steps (its momentum keeps moving it). Frozen
// parameters (requires_grad == 0) are in no partition and never touched.
//
// Checkpoints (ABI 1.1): each rank puts the inner-optimizer state of the
// item shards it owns as element ranges of optimizer/<param>/<field> (state.h;
// step counters by every owner of an item shard, equal values). load_state reads
// the ranges this rank owns under its own partition, so a checkpoint loads
// into another world size, stage or partition, and `allreduce` / `fused`
// checkpoints (same keys, whole tensors) load too. Parameters are the
// host's; the partition is recomputed, never saved.
//
// Thread safety: on_bucket_ready may run on the autograd thread, the other
// methods on the training thread; the host never runs them concurrently for
// one step's bucket (it waits in step()).
#pragma once

#include <torch/optim/optimizer.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/optimizer_state.hpp"
#include "distopt/sdk/sdk.hpp"
#include "partition.hpp"

namespace distopt::plugins::zero {

class ZeroAlgorithm : public sdk::Algorithm {
 public:
  /// ABI 1.4 devices: only libtorch tensor ops (shards are views and tensors on the
  /// parameters' device): any device (CUDA: world size 1 on an H200, STATUS.md).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  explicit ZeroAlgorithm(const dopt_algorithm_args& args);
  /// ABI 1.2 job check: stages 2 and 3 refuse a reducer without DOPT_TRAIT_EXACT_MEAN.
  static void check_job(const sdk::JobView& job);
  /// ABI 1.7: stage 3 shards the parameters of units.
  static int32_t param_sharding(const sdk::OptionsView& options);
  void gather_params(const dopt_bucket& bucket, DLTensor& full) override;
  void wait_params(const dopt_bucket& bucket) override;
  /// Stage 3: this rank's shard from the host's whole parameters (checkpoint restore).
  void scatter_params(const dopt_bucket& bucket, const DLTensor& full) override;
  void on_bucket_ready(const dopt_bucket& bucket) override;
  void step() override;
  /// ABI 1.8: finish this step's reductions and forget them (an inf/NaN
  /// gradient under mixed precision): no update, no synchronisation.
  void discard_step();
  /// ABI 1.9: stage 3 without overlap_comm waits for the reduce-scatters
  /// handed so far (true: the host frees their gradients).
  bool finish_buckets() override;
  void set_lr(int32_t group, double lr) override;
  /// ABI 1.5: the norm is summed over the item shards each rank owns, over the ranks.
  void set_grad_clip(double max_norm) override;
  uint64_t state_bytes() const override;
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;
  /// Bytes this rank sent in its own collectives so far (not the reducer's).
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }

 private:
  // Stage 2 state of one bucket.
  struct BucketShard {
    at::Tensor flat;   // the host's flat gradient buffer
    at::Tensor shard;  // this rank's reduced shard (owned)
    at::Tensor send;   // padded copy of flat while it is reduced (when needed)
    sdk::DLView send_view, shard_view;
    sdk::CommHandle pending;
    // Stage 3, a unit's bucket: this rank's parameter shard (owned), and
    // the gather into the host's full buffer.
    bool sharded = false;
    at::Tensor param_shard;
    sdk::DLView param_shard_view;
    // Mixed precision (ABI 1.8): the shard rounded to the model's dtype,
    // sent while a gather is pending.
    at::Tensor param_cast;
    sdk::DLView param_cast_view;
    sdk::CommHandle gathering;
    bool gather_started = false;
    bool done = false;  // its reduce-scatter was waited for before step()
  };

  // A tensor the optimizer steps: param_groups()[group].params()[index] is
  // elements [item_offset, +numel) of parameter `param` (an item shard).
  struct OwnedShard {
    size_t group, index, param, item_offset, numel;
  };

  // The constructor's steps, in order.
  void read_options(const dopt_algorithm_args& args);
  /// Aliases every trainable parameter and its gradient (flat); returns their indices.
  std::vector<size_t> alias_trainable_params(const dopt_algorithm_args& args);
  /// Stage 1: one partition of the trainable parameters (greedy or contiguous).
  FlatPartition partition_params(const dopt_algorithm_args& args,
                                 const std::vector<size_t>& trainable) const;
  /// Stages 2 and 3: one partition per bucket, and the bucket's reduced shard.
  void partition_buckets();
  /// Stage 3: wait for the reduce-scatters of the sharded buckets before
  /// `b` (the host frees their gradients next).
  void finish_earlier_units(size_t b);
  /// Stage 3: the parameter shard of every sharded bucket, from the host's
  /// parameters (valid during create only).
  void take_param_shards(const dopt_algorithm_args& args);
  /// The inner optimizer over this rank's item shards, and their checkpoint slices.
  void build_optimizer(const dopt_algorithm_args& args);

  size_t bucket_slot(const dopt_bucket& bucket) const;
  /// The host re-points parameters user code moved (torch::load, set_data;
  /// algorithm.h): alias the new memory, keeping the optimizer state.
  void follow_host_params();
  void sync_parameters();
  /// Forget every bucket's pending reduction and padded copy.
  void drop_bucket_work();
  /// Clip the owned item shards' gradients by the global norm (one scalar allreduce).
  void clip_owned_grads();
  void sync_by_allgather(const FlatPartition& partition);
  void sync_by_broadcast(const FlatPartition& partition);
  at::Tensor param_range(size_t param, size_t offset, size_t numel) const;
  void count_sent(uint64_t bytes);

  int32_t rank_ = 0, world_ = 1;
  int64_t stage_ = 1;
  std::string partition_kind_;  // option `partition`: greedy or contiguous
  bool bucket_view_ = false;
  bool overlap_comm_ = false;  // stage 3: option overlap_comm
  double grad_clip_ = 0;       // optimizer.grad_clip (0 = off)
  sdk::CommView comm_;
  sdk::ReducerView reducer_;
  std::vector<const dopt_bucket*> buckets_;
  std::vector<sdk::ReduceHandle> reduce_pending_;  // stage 1, per bucket
  std::vector<BucketShard> shards_;                // stage 2, per bucket
  const dopt_param* host_params_ = nullptr;        // the host's descriptors, stable until destroy
  std::vector<OwnedShard> owned_;                  // this rank's item shards, in optimizer order
  std::vector<at::Tensor> params_;   // per parameter: flat alias of the host's data (undefined
                                     // for a stage 3 unit's parameter after create)
  std::vector<bool> sharded_param_;  // stage 3: the parameter is in a sharded bucket
  std::vector<at::Tensor> grads_;    // per parameter: flat alias of its bucket slot
  std::vector<FlatPartition> partitions_;  // synchronised as units; stage 1: one, 2: per bucket
  std::vector<int32_t> group_slot_;        // dopt group -> optimizer param group
  std::vector<std::vector<sdk::ParamSlice>> slices_;  // per optimizer tensor: its item shard
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::atomic<uint64_t> bytes_sent_{0};  // on_bucket_ready may run on the autograd thread
};

}  // namespace distopt::plugins::zero
