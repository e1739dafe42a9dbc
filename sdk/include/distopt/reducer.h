/*
 * distopt plugin ABI v1: reducers (a DDP "communication hook": reduce one
 * gradient bucket across ranks).
 *
 * A bucket is a flat, contiguous buffer holding the gradients of several
 * parameters (core's BucketManager packs them in reverse registration order,
 * up to bucket_cap_mb, each entry aligned to align_bytes). After a successful
 * reduction the buffer must hold the *average* over ranks of the gradients
 * (or the reducer's approximation of it, for lossy reducers).
 */
#ifndef DISTOPT_REDUCER_H
#define DISTOPT_REDUCER_H

#include "distopt/abi.h"
#include "distopt/communicator.h"
#include "distopt/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One parameter's gradient inside a bucket. */
typedef struct dopt_bucket_entry {
  size_t struct_size;
  void* ext;
  const char* name;    /* parameter name ("fc1.weight") */
  int32_t param_index; /* index into the algorithm's parameter list */
  size_t offset;       /* in elements from the start of the bucket's flat buffer */
  size_t numel;
  int32_t ndim;         /* PowerSGD folds dims 1.. into a matrix */
  const int64_t* shape; /* ndim entries */
} dopt_bucket_entry;
#define DOPT_BUCKET_ENTRY_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_bucket_entry, shape)

typedef struct dopt_bucket {
  size_t struct_size;
  void* ext;
  int32_t index;  /* 0 = first bucket to become ready in backward */
  DLTensor* flat; /* 1-D, contiguous, all entries' dtype; length includes padding */
  const dopt_bucket_entry* entries;
  size_t num_entries;
} dopt_bucket;
#define DOPT_BUCKET_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_bucket, num_entries)

typedef struct dopt_reducer dopt_reducer;               /* one reducer instance */
typedef struct dopt_reduce_request dopt_reduce_request; /* one bucket reduction in flight */

typedef struct dopt_reducer_v1 {
  size_t struct_size;
  void* ext;

  /** Create a reducer that uses `comm` (borrowed; outlives the reducer). The
   * buckets (borrowed, stable until destroy) let a reducer size its state
   * (e.g. PowerSGD's Q matrices and error-feedback residuals). */
  dopt_status (*create)(const dopt_create_args* args, dopt_comm_ref comm,
                        const dopt_bucket* buckets, size_t num_buckets, dopt_reducer** out);
  dopt_status (*destroy)(dopt_reducer* r);

  /** Start reducing `bucket` in place (asynchronously). Buckets are reduced in
   * the same order on every rank. */
  dopt_status (*reduce)(dopt_reducer* r, const dopt_bucket* bucket, dopt_reduce_request** req);
  /** Like dopt_communicator_v1::test / wait / request_free. */
  dopt_status (*test)(dopt_reduce_request* req, int32_t* done);
  dopt_status (*wait)(dopt_reduce_request* req, int64_t timeout_ms);
  void (*request_free)(dopt_reduce_request* req);

  /** Bytes this rank actually put on the wire since creation (for reports
   * beside what a plain allreduce would send). */
  uint64_t (*bytes_sent)(const dopt_reducer* r);

  /* ---- ABI 1.1 (checkpoints, state.h); same rules as dopt_algorithm_v1's.
   * A stateless reducer puts nothing. ---- */

  /** Put this rank's state (error-feedback residuals, warm-start matrices,
   * step counters, RNG state) into `w`. Called on every rank between steps,
   * with no reduction in flight; must not use the communicator. */
  dopt_status (*save_state)(dopt_reducer* r, const dopt_state_writer* w);
  /** Restore from `r` (possibly saved with another world size). Called on
   * every rank after create, before the first reduce; no communicator use. */
  dopt_status (*load_state)(dopt_reducer* r, const dopt_state_reader* rd);
} dopt_reducer_v1;
#define DOPT_REDUCER_V1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_reducer_v1, bytes_sent)
#define DOPT_REDUCER_V1_1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_reducer_v1, load_state)

/** A reducer instance together with its vtable (borrowed from the host). */
typedef struct dopt_reducer_ref {
  const dopt_reducer_v1* vt;
  dopt_reducer* reducer;
} dopt_reducer_ref;

#ifdef __cplusplus
}
#endif

#endif /* DISTOPT_REDUCER_H */
