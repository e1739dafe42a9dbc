// The `hybrid` algorithm, after Megatron-LM's HybridDeviceOptimizer
// (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py; reference
// 003_aaf132140ca495b4): gradients are reduced bucket by bucket like
// `allreduce`, then the first `offload_fraction` of the parameters (by
// numel, greedy in parameter order: offload_split.hpp) are stepped on the
// host and the rest where they live ("the device").
//
// Host side, per offloaded parameter (one "chunk", Megatron's one CPU
// optimizer per parameter; with shard: true, per range of it this rank
// owns): a host copy of the parameter (fp32 with param_update_in_fp32, else
// the parameter's dtype; pinned when the parameter is on CUDA), a host
// gradient buffer of that dtype, and its own inner optimizer
// (sdk::make_optimizer over the one host copy; the optimizers of the
// factory update each element independently, so one per parameter equals
// one over all). A step: (1) every chunk's D2H work is
// queued (transfer.hpp): check the parameter against the value hybrid last
// wrote and refresh the host copy if they differ, then copy the gradient;
// (2) the device part steps meanwhile; (3) for each chunk in order: wait for
// its D2H, step its optimizer on the host, queue its H2D copy back into the
// parameter; (4) wait for every H2D. overlap_cpu_optimizer_d2h_h2d runs the
// D2H and H2D queues on their own threads (the host step of chunk i overlaps
// the copies of the others); off, the same work runs inline, in the same
// order, so the result is bitwise the same. Parameters on a device with
// streams (CUDA) and overlap: the queues are side streams, copies are
// non_blocking from/to pinned host memory, and a chunk completes once its
// side stream has drained (stream_transfer.hpp).
//
// Stale host copies (Megatron-LM PR 5071, Megatron-Bridge issue 4082): a
// user who loads model weights alone (torch::load, copy_ into parameters)
// leaves the host copies with the old values, and Megatron's next step
// overwrote the loaded model. Here every step compares each offloaded
// parameter bitwise with the host copy's image in the parameter's dtype
// (what hybrid wrote back) and refreshes the copy from the model when they
// differ (warning + metric hybrid.refreshed_params); a parameter the host
// re-pointed (set_data, torch::load's set_) is followed to its new memory.
// load_state refreshes the same way. Option refresh_masters: false turns
// the check off (reproduces Megatron's bug; tests use it).
//
// Device side: one inner optimizer over the other parameters, in place on
// the host's memory (gradients read from the reduced buckets), one group
// per dopt_param_group; with param_update_in_fp32 a non-fp32 parameter gets
// an fp32 master on its device (checked and refreshed as above).
//
// shard: true (ZeRO stage 1 over both parts): the trainable parameters laid
// back to back are partitioned into W equal shards (sdk/optim/flat_shards.hpp);
// each rank keeps host copies, gradient buffers and optimizer state only for
// the item shards in its shard (an offloaded one on the host, a device one in
// place), steps them, and one allgather then gives every rank the updated
// parameters. The offload split is the unsharded one (whole parameters,
// Megatron's rule), so each rank offloads ~fraction / W of the elements.
// Every bucket still goes through the job's reducer (any reducer). Needs one
// dtype for all trainable parameters (the allgather buffer).
//
// Checkpoints (ABI 1.1): the inner optimizers' state under
// optimizer/<param>/<field> (state.h): unsharded, whole tensors put by rank
// 0 (every rank holds the same); sharded, each rank puts its item shards as
// element ranges. The keys of `allreduce`, `fused` and `zero`, so a
// checkpoint moves between them, across world sizes, offload fractions and
// shard on / off. Host copies are not saved: a load refreshes them from the
// loaded model.
//
// Thread safety: on_bucket_ready may run on the autograd thread; step,
// set_lr, state_bytes, save/load on the training thread, never during a step.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "distopt/sdk/optim/flat_shards.hpp"
#include "distopt/sdk/optim/optimizer_state.hpp"
#include "distopt/sdk/sdk.hpp"
#include "transfer.hpp"

namespace distopt::plugins::hybrid {

class HybridAlgorithm : public sdk::Algorithm {
 public:
  /// ABI 1.4 devices: the model may be on the device (its purpose): the device part and
  /// the copies are libtorch ops; host state is in (pinned) CPU tensors of its
  /// own. CUDA: world size 1 on an H200 (STATUS.md).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  /// Throws sdk::Error(INVALID_ARGUMENT) for missing args, a parameter in
  /// an unknown group or a non-contiguous parameter, UNSUPPORTED for shard:
  /// true with mixed parameter dtypes, and what sdk::make_optimizer throws.
  explicit HybridAlgorithm(const dopt_algorithm_args& args);
  ~HybridAlgorithm() override;
  void on_bucket_ready(const dopt_bucket& bucket) override;
  void step() override;
  void set_lr(int32_t group, double lr) override;
  /// ABI 1.5: the owned shards' gradients (both sides, on the device, before the
  /// D2H copies) are clipped by the global norm; with shard: true the
  /// squares are summed over the ranks (one scalar allreduce).
  void set_grad_clip(double max_norm) override;
  uint64_t state_bytes() const override;
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;
  /// Bytes this rank sent in its own parameter allgathers (shard: true).
  uint64_t bytes_sent() const override { return bytes_sent_; }

 private:
  struct Param {  // one trainable parameter
    // Initialized: collect_params copies a Param into params_ before it sets
    // `offloaded` (copying an indeterminate bool is undefined; UBSan saw 64).
    const dopt_param* desc = nullptr;
    std::string name;
    at::Tensor model;  // flat alias of the host's parameter memory (re-pointed when it moves)
    void* model_ptr = nullptr;  // where `model` points
    at::Tensor grad;            // flat alias of its slot in a reduced bucket
    bool offloaded = false;
    int32_t group = 0;
  };
  struct OwnedShard {  // an item shard of one parameter this rank steps (whole when unsharded)
    size_t param;
    int64_t offset, numel;
    at::Tensor model;      // alias of the parameter's elements [offset, offset + numel)
    at::Tensor grad;       // alias of the same range of its gradient
    at::Tensor master;     // host copy (offloaded) or fp32 device master; undefined if none
    at::Tensor host_grad;  // offloaded: host gradient buffer
    at::Tensor stepped;    // the tensor its optimizer steps (an alias of model, or master)
    std::unique_ptr<torch::optim::Optimizer> host_opt;  // offloaded only
    sdk::ParamSlice slice;
  };

  void collect_params(const dopt_algorithm_args& args, double fraction);
  void make_owned_shards(const dopt_algorithm_args& args);
  void alias_owned_shard(OwnedShard& c);
  void build_device_optimizer(const dopt_algorithm_args& args);
  void make_transfers(bool overlap);  // StreamTransfer for device parameters with overlap
  void follow_moved_params();
  bool refresh_if_changed(OwnedShard& c);  // true when the master was refreshed
  void step_device();
  void step_host();
  void note_refreshed(int64_t count);
  void sync_shards();

  sdk::ReducerView reducer_;
  sdk::CommView comm_;
  int32_t rank_;
  int32_t world_size_;
  bool fp32_update_, refresh_, shard_;
  double grad_clip_ = 0;  // optimizer.grad_clip (0 = off)
  uint64_t bytes_sent_ = 0;
  std::vector<const dopt_bucket*> buckets_;
  std::vector<sdk::ReduceHandle> pending_;
  std::vector<Param> params_;          // trainable, in dopt_param order
  sdk::FlatPartition partition_;       // every rank's item shards (items = params_)
  std::vector<OwnedShard> owned_;      // what this rank steps, in parameter order
  std::vector<size_t> host_, device_;  // indices into owned_
  std::unique_ptr<torch::optim::Optimizer> device_opt_;
  std::vector<std::vector<sdk::ParamSlice>> device_slices_;
  std::unique_ptr<Transfer> d2h_, h2d_;  // last: their threads stop first
};

}  // namespace distopt::plugins::hybrid
