/*
 * distopt plugin ABI v1: algorithms (own the optimizer step: inner update
 * rule, optimizer state and parameter synchronisation).
 *
 * One training step as the host drives it:
 *   backward: as each gradient bucket becomes complete, on_bucket_ready(b)
 *             (from the autograd thread; it should only start async work);
 *   step():   wait for the bucket work, update the parameters (or the shard
 *             this rank owns), synchronise parameters, report metrics.
 * Parameters and gradients are borrowed DLTensors owned by the host; a
 * parameter's gradient is a view into one bucket's flat buffer, so the
 * algorithm updates the host's parameters in place.
 */
#ifndef DISTOPT_ALGORITHM_H
#define DISTOPT_ALGORITHM_H

#include "distopt/abi.h"
#include "distopt/communicator.h"
#include "distopt/reducer.h"
#include "distopt/state.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dopt_param {
  size_t struct_size;
  void* ext;
  const char* name;      /* "fc1.weight" */
  DLTensor* data;        /* contiguous; re-pointed before step() if user code moved it */
  DLTensor* grad;        /* same shape; a view into a bucket; NULL if frozen */
  int32_t group;         /* index into dopt_algorithm_args::groups */
  int32_t requires_grad; /* 0 for frozen parameters: never updated */
} dopt_param;
#define DOPT_PARAM_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_param, requires_grad)

/** Per-group overrides of the inner optimizer's options (negative = inherit). */
typedef struct dopt_param_group {
  size_t struct_size;
  void* ext;
  double lr;
  double weight_decay;
} dopt_param_group;
#define DOPT_PARAM_GROUP_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_param_group, weight_decay)

typedef struct dopt_algorithm_args {
  size_t struct_size;
  void* ext;
  const dopt_create_args* common; /* rank, world, the algorithm's own options, store */
  dopt_comm_ref comm;             /* borrowed, outlives the algorithm */
  dopt_reducer_ref reducer;       /* borrowed, outlives the algorithm */
  const dopt_param* params;       /* borrowed, stable until destroy */
  size_t num_params;
  const dopt_param_group* groups;
  size_t num_groups;
  const dopt_bucket* buckets; /* borrowed, stable until destroy */
  size_t num_buckets;
  const char* optimizer_name;            /* "sgd", "adam", "adamw", "adagrad", "rmsprop" */
  const dopt_options* optimizer_options; /* validated against the SDK's optimizer schema */
  /* ---- ABI 1.7 (parameter sharding, below). Read only when struct_size >=
   * DOPT_ALGORITHM_ARGS_V1_7_STRUCT_SIZE; an older host shards nothing. ---- */
  /** num_buckets flags, or NULL when no bucket is sharded: 1 when bucket b's
   * parameters form one unit whose parameters this algorithm shards. */
  const int32_t* bucket_sharded;
} dopt_algorithm_args;
#define DOPT_ALGORITHM_ARGS_STRUCT_SIZE \
  DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_args, optimizer_options)
#define DOPT_ALGORITHM_ARGS_V1_7_STRUCT_SIZE \
  DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_args, bucket_sharded)

/*
 * Parameter sharding (ABI 1.7; ZeRO stage 3, Rajbhandari et al. SC'20;
 * PyTorch FSDP, Zhao et al. VLDB'23). An algorithm whose param_sharding(options)
 * says so keeps, between steps, only its shard of each unit's parameters:
 *
 *  - Units. The host divides the model into units (distopt/sharded_unit.hpp:
 *    the modules the application wrapped) and plans one gradient bucket per
 *    unit, holding exactly the unit's trainable parameters at the bucket's
 *    entry offsets; bucket_sharded[b] is 1 for those. Parameters outside
 *    every unit are planned as usual (bucket_sharded 0) and stay whole on
 *    every rank, as in stage 2.
 *  - create(). The parameters of a sharded bucket are whole and valid during
 *    create only: the algorithm copies the elements it owns into memory of
 *    its own and must not keep pointers into them. Afterwards the host frees
 *    their memory; dopt_param::data of such a parameter is not valid after
 *    create returns.
 *  - Forward and backward. Before a unit's forward (and again before its
 *    backward, unless the host kept it), the host allocates the unit's full
 *    buffer and calls gather_params(bucket, full); it may issue the next
 *    unit's gather before waiting for this one (prefetch), and calls
 *    wait_params(bucket) before the parameters are read. After the unit's
 *    forward (or its backward) the host frees the buffer.
 *  - Gradients. A sharded bucket's flat buffer exists from the first
 *    gradient of the unit in a step until the algorithm is done reading it
 *    (its data pointer may change from step to step: read it in
 *    on_bucket_ready). The algorithm reduces it into the gradient shard it
 *    owns (a reduce-scatter) and updates its parameter shard in step();
 *    nothing is synchronised after step() for such buckets: the next gather
 *    reads the updated shards. When on_bucket_ready(b) returns, the
 *    algorithm must be done reading the flat buffers of the sharded buckets
 *    handed to it before b in this step: the host frees them then (and the
 *    rest when step() returns), so a rank holds about two units' full
 *    gradients at a time; one with finish_buckets (ABI 1.9).
 *  - Mixed precision (ABI 1.8; FSDP's MixedPrecision with fp32 reduction,
 *    ShardedGradScaler). Only for an algorithm whose vtable has
 *    discard_step; the host refuses the job for any other. The algorithm's
 *    parameters (dopt_param::data at create) and buckets are the fp32
 *    masters, so its shards are the sharded fp32 masters; the model's
 *    parameters are bf16 or fp16. gather_params then gets a `full` buffer of
 *    the model's dtype and writes its shards rounded to that dtype (round
 *    to nearest, as a tensor copy does: send the rounded shard, not fp32);
 *    scatter_params gets one of either dtype and converts. The host hands
 *    each bucket to on_bucket_ready during backward, already unscaled (fp32
 *    gradient / loss scale), before it knows whether any rank's gradients
 *    hold an inf or NaN; when one does, it calls discard_step() instead of
 *    step().
 */

typedef struct dopt_algorithm dopt_algorithm;

typedef struct dopt_algorithm_v1 {
  size_t struct_size;
  void* ext;

  /** Collective: every rank creates its instance with the same arguments
   * (shapes, options) before the first step. */
  dopt_status (*create)(const dopt_algorithm_args* args, dopt_algorithm** out);
  dopt_status (*destroy)(dopt_algorithm* a);

  /** bucket (borrowed from args->buckets) holds this rank's complete local
   * gradients. Called once per bucket per step, in the same order on every
   * rank, possibly from the autograd engine's thread: start work and return. */
  dopt_status (*on_bucket_ready)(dopt_algorithm* a, const dopt_bucket* bucket);
  /** Finish the step: wait for bucket work, update parameters, sync them. */
  dopt_status (*step)(dopt_algorithm* a);

  /** Change a group's learning rate (schedules). */
  dopt_status (*set_lr)(dopt_algorithm* a, int32_t group, double lr);
  /** Bytes of optimizer state this rank holds (momentum, Adam moments, ...). */
  uint64_t (*state_bytes)(const dopt_algorithm* a);

  /* ---- ABI 1.1 (checkpoints, state.h; the algorithm's own traffic). A 1.0
   * plugin's vtable ends above; the host checks struct_size >=
   * DOPT_ALGORITHM_V1_1_STRUCT_SIZE and a non-NULL pointer, else saving a
   * checkpoint fails with UNSUPPORTED naming the plugin. ---- */

  /** Put this rank's state (inner-optimizer state of what it owns, and
   * anything else it needs to continue exactly) into `w`. Called on every
   * rank between steps (after step() returned, before the next backward);
   * must not use the communicator. Parameters are saved by the host. */
  dopt_status (*save_state)(dopt_algorithm* a, const dopt_state_writer* w);
  /** Restore from `r`, which may come from another world size or another
   * algorithm (reshard: read the element ranges this rank now owns).
   * Called on every rank after create and before the first step, with the
   * host's parameters already restored; must not use the communicator.
   * INVALID_ARGUMENT naming the key for missing or mismatched state. */
  dopt_status (*load_state)(dopt_algorithm* a, const dopt_state_reader* r);
  /** Bytes this algorithm itself put on the wire from this rank since
   * creation, besides what went through the reducer (ZeRO's reduce-scatter
   * and parameter allgather / broadcasts). May be NULL: 0. */
  uint64_t (*bytes_sent)(const dopt_algorithm* a);

  /* ---- ABI 1.5 (host-level gradient clipping, the job's
   * optimizer.grad_clip). An older vtable ends above; the host checks
   * struct_size >= DOPT_ALGORITHM_V1_5_STRUCT_SIZE and a non-NULL pointer,
   * else a job with grad_clip > 0 is refused naming the algorithm and its
   * plugin file. ---- */

  /** From the next step() on, clip the gradient the inner optimizer applies
   * to a total L2 norm of at most `max_norm` (0 = off; finite, >= 0), as
   * torch.nn.utils.clip_grad_norm_ over the whole model: after the
   * reduction (and the host's loss unscaling), before the update, total =
   * sqrt(sum_i ||g_i||^2) and every g_i *= min(1, max_norm / (total + 1e-6)).
   * Algorithms with one global gradient clip its global norm: replicated
   * gradients (allreduce, fused, hybrid unsharded) compute it locally;
   * sharded ones (zero, hybrid shard: true) sum the squares of the shards
   * each rank owns over the ranks (one scalar allreduce per step).
   * Algorithms without a global gradient (decentralized, local_sgd after
   * its warm-up) clip each rank's own gradient. Report the pre-clip total
   * as metric "optimizer.grad_norm" (sdk/grad_clip.hpp does all of this).
   * Called on the training thread between steps, on every rank with the
   * same value. UNSUPPORTED when the algorithm cannot clip. */
  dopt_status (*set_grad_clip)(dopt_algorithm* a, double max_norm);

  /* ---- ABI 1.7 (parameter sharding, above). An older vtable ends above;
   * the host checks struct_size >= DOPT_ALGORITHM_V1_7_STRUCT_SIZE and
   * non-NULL pointers, else it never shards parameters for this algorithm.
   * ---- */

  /** Static (no instance; any thread): whether an instance created with
   * these validated options shards the parameters of units.
   * DOPT_PARAM_SHARDING_NONE, _FULL (free a unit's parameters after its
   * forward and gather them again for its backward: FSDP's FULL_SHARD) or
   * _KEEP_FOR_BACKWARD (keep them from the forward until the unit's backward:
   * FSDP's SHARD_GRAD_OP, ZeRO-3 without re-gathering). */
  int32_t (*param_sharding)(const dopt_options* options);
  /** Start writing the full parameters of sharded bucket `bucket` (borrowed
   * from args->buckets) into `full`: 1-D, contiguous, the parameters' dtype
   * (ABI 1.8, under mixed precision: the model's, see above) and device, ceil(bucket length / world
   * size) x world size elements, laid out as the bucket's entries (offset, numel); the padding is
   * unspecified. `full` stays valid until wait_params for this bucket
   * returns. Collective: every rank gathers the same buckets in the same
   * order. Training or autograd thread, never concurrently with itself, step()
   * or on_bucket_ready. INVALID_ARGUMENT for a bucket that is not sharded;
   * STATE when a gather of this bucket is already pending. */
  dopt_status (*gather_params)(dopt_algorithm* a, const dopt_bucket* bucket, DLTensor* full);
  /** Wait for the gather of `bucket`: afterwards `full` holds its parameters
   * (on device memory: ordered on the communicator's stream). STATE when
   * none is pending. */
  dopt_status (*wait_params)(dopt_algorithm* a, const dopt_bucket* bucket);
  /** Set this rank's shard of sharded bucket `bucket`'s parameters from
   * `full` (laid out as for gather_params, borrowed for the call): the host
   * changed the whole parameters, e.g. restored a checkpoint into them.
   * Local (no communication); between steps, on every rank. */
  dopt_status (*scatter_params)(dopt_algorithm* a, const dopt_bucket* bucket, const DLTensor* full);

  /* ---- ABI 1.8 (parameter sharding under mixed precision, above). An
   * older vtable ends above; the host checks struct_size >=
   * DOPT_ALGORITHM_V1_8_STRUCT_SIZE and a non-NULL pointer, else it refuses
   * mixed precision for an algorithm that shards parameters. ---- */

  /** End the step without an update, in place of step(): every bucket of
   * this step went to on_bucket_ready, and some rank's gradients hold an
   * inf or NaN (the loss scale overflowed). Wait for (or cancel) the work
   * started on them; the host frees the buckets' memory when this returns.
   * Parameters, their shards, optimizer state and step counters stay as
   * they were; nothing is synchronised. Collective (every rank discards the
   * same step); training thread, between backward and the next forward. */
  dopt_status (*discard_step)(dopt_algorithm* a);

  /* ---- ABI 1.9 (parameter sharding: gradient memory). An older vtable
   * ends above; the host then frees a unit's gradient bucket when a later
   * on_bucket_ready returns, as in 1.7. ---- */

  /** Parameter sharding: the host is about to give memory to a unit's
   * gradient bucket (that unit's first gradient of the step is ready) while
   * buckets handed to on_bucket_ready in this step may still be read. Set
   * *finished to 1 after completing every use of the sharded buckets handed
   * so far in this step (waiting for their reduce-scatters): the host frees
   * them when this returns, so a rank holds one unit's full gradients at a
   * time (plus the gradient autograd just made), and the reduce-scatter of
   * a unit overlaps the next unit's backward only up to that unit's first
   * gradient. Set 0 to keep reading them (more overlap, one more unit's
   * gradients in memory; DeepSpeed's overlap_comm): the host frees them
   * when a later on_bucket_ready returns. Autograd thread, never
   * concurrently with on_bucket_ready; not called under no_sync. */
  dopt_status (*finish_buckets)(dopt_algorithm* a, int32_t* finished);
} dopt_algorithm_v1;
#define DOPT_ALGORITHM_V1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_v1, state_bytes)
#define DOPT_ALGORITHM_V1_1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_v1, bytes_sent)
#define DOPT_ALGORITHM_V1_5_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_v1, set_grad_clip)
#define DOPT_ALGORITHM_V1_7_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_v1, scatter_params)
#define DOPT_ALGORITHM_V1_8_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_v1, discard_step)
#define DOPT_ALGORITHM_V1_9_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_algorithm_v1, finish_buckets)

/* dopt_algorithm_v1::param_sharding results. */
#define DOPT_PARAM_SHARDING_NONE 0
#define DOPT_PARAM_SHARDING_FULL 1
#define DOPT_PARAM_SHARDING_KEEP_FOR_BACKWARD 2

#ifdef __cplusplus
}
#endif

#endif /* DISTOPT_ALGORITHM_H */
