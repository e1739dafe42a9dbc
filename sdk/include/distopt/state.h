/*
 * distopt plugin ABI v1.1: component state for checkpoints.
 *
 * A component describes its state as named *logical tensors* (e.g. the Adam
 * first moment of parameter "fc1.weight") and hands the host the part of
 * each that this rank holds. Because the host knows which element range of
 * which logical tensor every rank saved, it can load a checkpoint into a
 * different world size (ZeRO resharding), consolidate it into one file, and
 * let a component ask for any element range it now owns.
 *
 * Kinds of entries:
 *  - DOPT_STATE_SHARDED: this rank holds elements [offset, offset + numel) of
 *    a logical tensor of global_numel elements (row-major in `shape`). The
 *    pieces put by all ranks must cover the tensor; pieces of different
 *    ranks may overlap only where they hold equal values (e.g. a step counter
 *    kept by every owner of a split parameter); the reader then returns the
 *    lowest rank's. State every rank holds in full (plain allreduce) is put
 *    whole (offset 0, numel = global_numel) by every rank through
 *    put_replicated (ABI 1.6; sdk::StateWriter::replicated), or by one rank
 *    only through put.
 *  - DOPT_STATE_RANK_LOCAL: a value that differs per rank and has no global
 *    meaning of its own (error-feedback residuals, a rank's RNG state).
 *    Loaded into the same world size, rank r reads what rank r saved. Into
 *    another world size, floating-point entries read the mean over the saved
 *    ranks (for error feedback this keeps the average pending correction, the
 *    quantity the compressed updates are unbiased against), other dtypes read
 *    saved rank (r mod saved_world_size)'s.
 *
 * Keys are UTF-8 and unique within one component on one rank; the host
 * prefixes them with the component kind ("algorithm/", "reducer/"). Use the
 * conventions below so that checkpoints move between algorithms (an
 * `allreduce` checkpoint loads into `zero` and back):
 *    optimizer/<param name>/<field>   inner-optimizer state of one parameter,
 *                                     with libtorch's field names (step,
 *                                     momentum_buffer, exp_avg, exp_avg_sq,
 *                                     max_exp_avg_sq, sum, square_avg,
 *                                     grad_avg); shape = the parameter's.
 *    error_feedback/<param name>      a reducer's residual (RANK_LOCAL).
 */
#ifndef DISTOPT_STATE_H
#define DISTOPT_STATE_H

#include "distopt/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DOPT_STATE_SHARDED = 0,
  DOPT_STATE_RANK_LOCAL = 1,
} dopt_state_kind;

/** One piece of a logical tensor. Everything is borrowed for the put() call. */
typedef struct dopt_state_entry {
  size_t struct_size;
  void* ext;
  const char* key;
  const DLTensor* tensor; /* the piece: contiguous, kDLCPU, any ABI dtype; numel elements */
  int32_t kind;           /* dopt_state_kind */
  int64_t offset;         /* SHARDED: first element of the piece in the logical tensor; else 0 */
  int32_t ndim;           /* shape of the whole logical tensor (ndim 0 = a scalar) */
  const int64_t* shape;   /* ndim entries; RANK_LOCAL: the piece's own shape */
} dopt_state_entry;
#define DOPT_STATE_ENTRY_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_state_entry, shape)

/** Where a component's save_state puts its entries (implemented by the host). */
typedef struct dopt_state_writer {
  size_t struct_size;
  void* ext;
  void* ctx;
  /** Copy `entry` into the checkpoint before returning. INVALID_ARGUMENT
   * (message names the key) for a duplicate key, an unknown kind, a piece
   * outside its logical tensor, a non-contiguous or non-CPU tensor. */
  dopt_status (*put)(void* ctx, const dopt_state_entry* entry);
  /** ABI 1.6 (check DOPT_HAS_FIELD; absent in older hosts): put a value that
   * every rank holds whole and equal (plain allreduce's optimizer state),
   * from every rank. `entry` is DOPT_STATE_SHARDED with offset 0 and the
   * whole logical tensor. The host keeps one copy, rank 0's, in a
   * checkpoint, where it reads back as an ordinary SHARDED entry; for an
   * elastic in-memory commit each rank keeps its own copy, which then needs
   * no buddy copy. With an older host put it from rank 0 only, with put().
   * Same errors as put(), and INVALID_ARGUMENT for a piece that is not the
   * whole tensor. */
  dopt_status (*put_replicated)(void* ctx, const dopt_state_entry* entry);
} dopt_state_writer;
#define DOPT_STATE_WRITER_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_state_writer, put_replicated)
/* Hosts of ABI 1.1 - 1.5. */
#define DOPT_STATE_WRITER_V1_1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_state_writer, put)

/** What a component's load_state reads from (implemented by the host). */
typedef struct dopt_state_reader {
  size_t struct_size;
  void* ext;
  void* ctx;
  int32_t saved_world_size; /* the world size the checkpoint was written with */
  /** Whether `key` exists; if so (and the pointers are non-NULL) its kind,
   * saved dtype and logical shape (up to 8 dims; *ndim is set). */
  dopt_status (*find)(void* ctx, const char* key, int32_t* found, int32_t* kind, DLDataType* dtype,
                      int32_t* ndim, int64_t shape[8]);
  /** Fill `out` (contiguous, kDLCPU, n elements of any float/int ABI dtype:
   * values are converted) with elements [offset, offset + n) of logical
   * tensor `key` (RANK_LOCAL: of the value this rank reads, see above).
   * INVALID_ARGUMENT naming the key when it is missing or the range is
   * outside it or not covered by the saved pieces. */
  dopt_status (*read)(void* ctx, const char* key, int64_t offset, DLTensor* out);
} dopt_state_reader;
#define DOPT_STATE_READER_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_state_reader, read)

#ifdef __cplusplus
}
#endif

#endif /* DISTOPT_STATE_H */
