// The optimizer an application steps: gradient buckets + reducer + algorithm.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distopt/buckets.hpp"
#include "distopt/buffers.hpp"
#include "distopt/lr_schedule.hpp"
#include "distopt/precision.hpp"

namespace at {
class Tensor;  // <ATen/ATen.h>; callers of scale_loss include it
}

namespace distopt {

struct ComponentConfig;  // distopt/config.hpp: a {name, options} section

/// One communication setting autotuning tries (`autotune:`, config.hpp).
struct AutotuneSetting {
  double bucket_cap_mb = kDefaultBucketCapMb;  ///< MiB per gradient bucket
  bool overlap = kDefaultOverlap;              ///< reduce buckets during backward (else in step())
  bool hierarchical = false;                   ///< the `hierarchical` reducer (else flat `mean`)
  bool operator==(const AutotuneSetting& o) const {
    return bucket_cap_mb == o.bucket_cap_mb && overlap == o.overlap &&
           hierarchical == o.hierarchical;
  }
  bool operator!=(const AutotuneSetting& o) const { return !(*this == o); }
};

/// A row of the autotuning table: a setting and the median seconds per step
/// of the slowest rank while it ran.
struct AutotuneRow {
  AutotuneSetting setting;
  double seconds = 0;
};

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

  /// Gradient accumulation (DDP's no_sync(), DeepSpeed's
  /// gradient_accumulation_steps): while the returned guard lives, backward
  /// passes only add their gradients into the buckets; nothing is sent. The
  /// next backward outside a guard sends the accumulated sums, bucket by
  /// bucket as usual (so every algorithm and reducer, error feedback and
  /// PowerSGD included, sees the accumulated gradient once), and step()
  /// applies them; a step() right after guarded backward passes sends them
  /// too. Bytes per step do not depend on the number of micro-batches.
  /// Scale each micro-batch's loss by 1/K to get the mean over K. Local (no
  /// collective): every rank must accumulate the same number of times.
  /// Training thread only; guards do not nest.
  class NoSync {
   public:
    explicit NoSync(DistributedOptimizer& opt);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedOptimizer* opt_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  /// Finish reducing the gradients of the last backward and run the
  /// algorithm's step. Collective. Throws CommError / ComponentError.
  void step();
  /// Uneven inputs (PyTorch's Join context manager, with DDP and
  /// ZeroRedundancyOptimizer as Joinables): a rank whose data is exhausted
  /// calls join() instead of further steps, and every rank calls it once
  /// after its own last step(). It returns on every rank when all ranks have
  /// joined. Until then the joined rank shadows each step of the others: it
  /// takes part in that step's collectives with zero gradients and runs the
  /// same algorithm step (zero: it still owns its shard, updates it and
  /// takes part in the parameter sync), and buffers are synchronised as in
  /// step(), so every rank ends with the same parameters and buffers. While
  /// k ranks have joined, the gradients are averaged over the W - k ranks
  /// that contributed (the job's join.divide_by_initial_world_size: over W,
  /// as DDP's option). Lossy reducers see the joined rank's zero gradient
  /// (plus its error-feedback residual) like any other.
  ///
  /// Needs the job's `join: {enabled: true}` on every rank (off by default,
  /// as PyTorch's Join is opt-in): then every step starts with one 4-byte
  /// SUM allreduce counting the ranks not joined (1 rank: none).
  /// Returns the number of steps this rank shadowed. Throws ConfigError when
  /// join.enabled is false, distopt::Error when a backward's buckets await
  /// step(); CommError / ComponentError as step(). Training thread only.
  int64_t join();

  /// Set the learning rate of parameter group `group`. With a learning-rate
  /// schedule this is the group's base: step k uses lr x factor(k). Kept
  /// across add_param_group / switch_to and in checkpoints. Throws
  /// ComponentError (INVALID_ARGUMENT) for a group that does not exist.
  void set_lr(double lr, int group = 0);

  /// Scale every group's base learning rate by `schedule.factor(steps())`
  /// at the start of each step() (torch's LambdaLR over optimizer steps;
  /// lr_schedule.hpp has the kinds and formulas). Replaces the job's
  /// optimizer.lr_schedule. Bases: set_lr's value, else the group's lr, else
  /// the optimizer's `lr` (one_cycle: the peak). The position is steps(), so
  /// a resumed checkpoint continues the schedule exactly; add_param_group
  /// and switch_to keep it. Call on every rank with the same schedule,
  /// between steps. Throws ConfigError naming the key
  /// (optimizer.lr_schedule.total_steps: required ...) for an invalid one.
  void set_lr_schedule(const LrSchedule& schedule);
  /// The schedule in use (the job's optimizer.lr_schedule or set_lr_schedule).
  const std::optional<LrSchedule>& lr_schedule() const;
  /// The learning rate of `group` that the next step() uses: its base x the
  /// schedule's factor at steps() (the base without a schedule). Throws
  /// ConfigError for a group that does not exist.
  double lr(int group = 0) const;

  /// Keep `named_buffers` (tensors on one device, e.g. module.named_buffers():
  /// BatchNorm running statistics) equal on every rank: at the end of every step(),
  /// skipped mixed-precision steps included, one collective for all of them
  /// (buffers.hpp has the modes; broadcast and average send
  /// sum(bytes) resp. 8 bytes per element). make_optimizer(module) calls it
  /// with the module's buffers and the job's `buffers.sync`. Every rank must
  /// pass the same names, shapes and dtypes in the same order, between
  /// steps; a later call replaces the earlier one. The collective runs on the
  /// buffers' device (host buffers beside a device-only communicator go over
  /// the control communicator). Throws ConfigError for buffers on two
  /// devices. Not thread-safe (training thread).
  void set_buffers(const std::vector<std::pair<std::string, at::Tensor>>& named_buffers,
                   BufferSync mode);
  /// The mode set_buffers was given (none if never called).
  BufferSync buffer_sync() const;

  /// torch.optim.Optimizer.add_param_group / ZeroRedundancyOptimizer's: add
  /// `named_params` as a new parameter group, number num_param_groups()
  /// before the call, with its own `lr` / `weight_decay` (negative = the
  /// optimizer's option). Use: fine-tuning, where frozen layers become
  /// trainable (set requires_grad first: a parameter without it is added
  /// frozen, in no partition and never updated).
  ///
  /// Collective: every rank calls it with the same names, shapes, dtypes and
  /// options, in the same order (checked: a mismatch throws ConfigError on
  /// every rank). The new parameters are broadcast from rank 0 first, so
  /// every rank starts them equal. Call it between steps: after step(),
  /// before the next backward (or after a backward that launched nothing,
  /// e.g. with overlap: false, whose gradients are then kept).
  ///
  /// The optimizer is rebuilt in place: buckets are planned again over all
  /// parameters, and the algorithm re-partitions them (zero gives the new
  /// parameters owners like any other, so its per-rank state stays ~1/W).
  /// Every rank's algorithm and reducer state is saved through the ABI 1.1
  /// state writer, exchanged among all ranks (each rank receives the state
  /// of every rank, so memory peaks at about the whole optimizer state plus
  /// its encoding, briefly) and read back under the new ownership. Kept:
  /// optimizer state, steps(), learning rates set with set_lr, the loss
  /// scaler, fp32 master weights (mixed precision), bytes counters. The new
  /// parameters start without optimizer state, as in PyTorch (adagrad: its
  /// constructor's step 0 and initial_accumulator_value). The .grad of every
  /// parameter becomes a view of the new buckets (current values copied).
  ///
  /// Throws ConfigError (on every rank, before anything changes) for an
  /// empty list, an empty name, an undefined, sparse or non-contiguous
  /// tensor, a name already in the optimizer or given twice, a non-finite
  /// lr / weight_decay, or ranks that disagree; distopt::Error when a bucket
  /// of the last backward is still being reduced (call step() first);
  /// ComponentError / CheckpointError when a plugin cannot save or load its
  /// state (e.g. built for ABI 1.0, or `fused`, which keeps one step counter
  /// for all parameters, once it has stepped a stateful optimizer); CommError.
  /// On any failure after the first collective every rank throws, and the
  /// optimizer stays as it was (the new parameters may already hold rank
  /// 0's values). A checkpoint saved afterwards loads into an optimizer that
  /// has the same groups (make_optimizer with them, or the same
  /// add_param_group calls before load_checkpoint). Training thread only,
  /// like step().
  void add_param_group(const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                       double lr = -1, double weight_decay = -1);
  /// Number of parameter groups: set_lr takes 0 .. num_param_groups() - 1.
  int num_param_groups() const;

  /// True when the algorithm keeps its own replica of the parameters on
  /// every rank between synchronisations (ABI 1.2 trait
  /// DOPT_TRAIT_LOCAL_REPLICAS: decentralized, local SGD). Checkpoints then
  /// hold the replicas' mean as the model, and `distopt train` evaluates it.
  bool replicas_differ() const;
  /// The mean over ranks of the parameters the optimizer steps.
  struct ReplicaAverage {
    /// (name, mean) in make_optimizer's order, new tensors of each
    /// parameter's dtype and shape (frozen parameters included: equal).
    std::vector<std::pair<std::string, at::Tensor>> params;
    /// (1/W) sum_i ||x_i - mean||^2 over all parameters (squared L2, the
    /// consensus distance of Kong et al., ICML 2021); 0 when every rank holds
    /// the same values.
    double consensus_distance = 0;
  };
  /// Collective (every rank, between steps): one SUM allreduce of all
  /// parameters (fp32 accumulation for low-precision ones) and one of a
  /// scalar. Changes nothing. Throws CommError.
  ReplicaAverage average_replicas();

  // ---- Switching algorithms during training (Bagua's ModelSwitchWrapper
  // .switch_to; the job's `schedule:` section) ----

  /// Replace the algorithm and reducer by `algorithm` and `reducer` (each
  /// {name, options}, validated against the job like its own sections; a
  /// component's check_job may refuse it). Collective: every rank calls it
  /// with the same components and options (checked), between steps.
  ///
  /// First the ranks agree on the parameters: if the current algorithm keeps
  /// local replicas (replicas_differ()), every rank takes their mean, as
  /// Bagua's allreduce_parameters. Then the optimizer is rebuilt as
  /// add_param_group does: the buckets are planned again with the new
  /// reducer's bucket options, the old components' state is exchanged and
  /// loaded into the new ones (so the inner optimizer's state carries over
  /// between zero, allreduce, fused, decentralized, local_sgd; a reducer's
  /// own state, e.g. error feedback, only to a reducer that reads the same
  /// keys), the old components are destroyed (their hooks and threads gone),
  /// and steps(), learning rates, the loss scaler and byte counters carry
  /// over. Leaves the schedule position as it is.
  ///
  /// Throws ConfigError / PluginError (on every rank, before anything
  /// changes) for an unknown component, bad options, a refusal, or ranks
  /// that disagree; distopt::Error when a bucket of the last backward is in
  /// flight; ComponentError / CheckpointError / CommError as
  /// add_param_group, after which the optimizer is unchanged on every rank.
  /// Training thread only.
  void switch_to(const ComponentConfig& algorithm, const ComponentConfig& reducer);
  /// The epoch about to start (0-based), as DistributedSampler.set_epoch:
  /// a `schedule:` phase with until_epoch: E ends at set_epoch(E). Switches
  /// phase when a bound is reached (collective then, as switch_to; every
  /// rank passes the same epoch). No-op without a schedule except that the
  /// value is remembered.
  void set_epoch(int64_t epoch);
  /// The `schedule:` phase running (0-based), or -1 when the job has none.
  /// step() moves on by itself once steps() reaches a phase's until_step.
  int schedule_phase() const;
  /// Go to schedule phase `phase` (as its bound had been reached); used by
  /// load_checkpoint to resume in the saved phase. Collective. Throws
  /// ConfigError when there is no such phase.
  void switch_to_phase(int phase);

  // ---- Autotuning (the job's `autotune:` section, config.hpp) ----

  /// After tuning: (bucket_cap_mb, median seconds per step of the slowest
  /// rank) for every setting tried, in the order tried; empty before (and
  /// after a resume that restored the choice without tuning). The whole
  /// setting of each row is in autotune_rows().
  std::vector<std::pair<double, double>> autotune_table() const;
  /// Same rows with the whole setting (overlap, hierarchical).
  std::vector<AutotuneRow> autotune_rows() const;
  /// The bucket_cap_mb autotuning chose (MiB), or -1 while tuning / without
  /// `autotune:`. Saved in checkpoints: a resume applies it, no tuning again.
  double autotuned_bucket_cap_mb() const;
  /// The whole setting autotuning chose; empty while tuning / without
  /// `autotune:`. Saved in checkpoints like the cap.
  std::optional<AutotuneSetting> autotuned_setting() const;

  uint64_t state_bytes() const;
  /// Bytes put on the wire from this rank since make_optimizer: the
  /// reducer's count plus (ABI 1.1) what the algorithm sent itself, e.g.
  /// ZeRO's reduce-scatter and parameter sync (the components
  /// add_param_group replaced included). Not counted: the host's own small
  /// collectives (the join count, 4 bytes a step; the mixed-precision
  /// inf/NaN flag) and buffer synchronisation (metric
  /// optim.buffer_sync_bytes).
  uint64_t bytes_sent() const;
  /// Bytes a plain allreduce of the same buckets would have put on the wire
  /// over the steps run since make_optimizer (as bytes_sent: steps restored
  /// from a checkpoint are not counted).
  uint64_t bytes_sent_plain_allreduce() const;
  /// Number of buckets, and steps taken (skipped mixed-precision steps excluded).
  size_t num_buckets() const;
  int64_t steps() const;
  const std::string& algorithm_name() const;
  /// The reducer's component name ("mean", "powersgd").
  const std::string& reducer_name() const;

  // ---- Parameter sharding (zero stage 3; distopt/sharded_unit.hpp) ----

  /// True when the algorithm shards the parameters of the model's units
  /// (ABI 1.7 param_sharding, e.g. zero with stage: 3, and the module given
  /// to make_optimizer has distopt::ShardedUnit modules).
  bool shards_parameters() const;
  /// While the returned guard lives, every unit's full parameters are
  /// present (FSDP's summon_full_params): read or evaluate the model outside
  /// the units' own forwards. Changes made to them are not kept (each rank
  /// steps its shard). Collective: every rank takes and drops the guard at
  /// the same point, between steps. A no-op without parameter sharding.
  class GatheredParams {
   public:
    explicit GatheredParams(DistributedOptimizer& opt);
    ~GatheredParams();
    GatheredParams(const GatheredParams&) = delete;
    GatheredParams& operator=(const GatheredParams&) = delete;

   private:
    DistributedOptimizer* opt_;
  };
  [[nodiscard]] GatheredParams gather_params() { return GatheredParams(*this); }
  /// Memory of the units' full parameters, in bytes, on this rank.
  struct ShardingMemory {
    size_t units = 0;            ///< units whose parameters are sharded
    uint64_t gathered = 0;       ///< full buffers present now
    uint64_t peak_gathered = 0;  ///< most present at once since the last call
    /// Freed CPU blocks (full buffers, units' gradient buckets) kept for
    /// the next gathers, as CUDA's caching allocator keeps memory reserved:
    /// at most 4 blocks, each about one unit's parameters.
    uint64_t cached = 0;
    /// Bytes of units' full gradients present now (the gradient buckets,
    /// and their fp32 copies under mixed precision): 0 between steps.
    uint64_t unit_grads = 0;
    /// Most bytes of units' full gradients present at once since the last
    /// call: one unit's (the one being filled) when the algorithm frees a
    /// unit's gradients before the next unit's take memory (zero stage 3 by
    /// default, ABI 1.9 finish_buckets), two with `overlap_comm: true`.
    /// Autograd's fresh gradient of a parameter, before it is added into its
    /// bucket, is not counted.
    uint64_t peak_unit_grads = 0;
  };
  /// Reads and restarts the peak. Zeros without parameter sharding.
  ShardingMemory sharding_memory();

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
