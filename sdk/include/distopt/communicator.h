/*
 * distopt plugin ABI v1: communicators (move bytes between ranks).
 *
 * Tensors are borrowed DLTensor* describing dense, contiguous host (kDLCPU)
 * or device memory; the caller keeps them alive and untouched until the
 * request completes. Every collective is asynchronous: it enqueues work on the
 * communicator's progress thread(s) and returns a request. Collectives must be
 * issued in the same order on every rank of the communicator (as in NCCL and
 * Gloo). Supported reduction dtypes are listed by each plugin; `tcp` supports
 * float32, float64, bfloat16, float16, int32 and int64.
 *
 * Failure: every operation has a timeout (the communicator's `timeout_s`
 * option); a peer that dies makes every pending request on the other ranks
 * complete with DOPT_ERR_COMM and an error message naming the peer's rank and
 * the operation. No call hangs forever.
 */
#ifndef DISTOPT_COMMUNICATOR_H
#define DISTOPT_COMMUNICATOR_H

#include "distopt/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dopt_comm dopt_comm;       /* one communicator instance (a process group) */
typedef struct dopt_request dopt_request; /* one in-flight operation */

typedef enum {
  DOPT_REDUCE_SUM = 0,
  DOPT_REDUCE_AVG = 1, /* sum divided by the communicator's world size */
  DOPT_REDUCE_MIN = 2,
  DOPT_REDUCE_MAX = 3,
} dopt_reduce_op;

typedef struct dopt_communicator_v1 {
  size_t struct_size;
  void* ext;

  /** Create this rank's endpoint of a new communicator spanning args->world_size
   * ranks; collective (every rank calls it, same scope). Uses args->store to
   * exchange addresses. Blocks until connected or the timeout expires. */
  dopt_status (*create)(const dopt_create_args* args, dopt_comm** out);
  /** Abort pending requests (they complete with DOPT_ERR_ABORTED), close
   * connections and free. Requests must still be freed by their owner. */
  dopt_status (*destroy)(dopt_comm* comm);

  /** Rank and size of this endpoint. Thread-safe. */
  int32_t (*rank)(const dopt_comm* comm);
  int32_t (*world_size)(const dopt_comm* comm);

  /** recv[i] = op over ranks of send[i]; send and recv have the same dtype and
   * element count; send == recv (same data pointer) is in-place. */
  dopt_status (*allreduce)(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_reduce_op op,
                           dopt_request** req);
  /** send holds world_size * n elements; recv (n elements) gets the op over
   * ranks of block `rank` of send. */
  dopt_status (*reduce_scatter)(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                                dopt_reduce_op op, dopt_request** req);
  /** send holds n elements; recv (world_size * n) gets every rank's send, in
   * rank order. */
  dopt_status (*allgather)(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                           dopt_request** req);
  /** buf on `root` is copied into buf on every other rank. */
  dopt_status (*broadcast)(dopt_comm* comm, DLTensor* buf, int32_t root, dopt_request** req);
  /** Point-to-point; a send matches the recv with the same (peer, tag) pair,
   * in order. Sizes must match. */
  dopt_status (*send)(dopt_comm* comm, const DLTensor* buf, int32_t peer, int32_t tag,
                      dopt_request** req);
  dopt_status (*recv)(dopt_comm* comm, DLTensor* buf, int32_t peer, int32_t tag,
                      dopt_request** req);
  /** Completes when every rank has entered the barrier. */
  dopt_status (*barrier)(dopt_comm* comm, dopt_request** req);
  /** Collective over comm: ranks with the same color form a new communicator,
   * ordered by (key, old rank). color < 0 gives *out = NULL. Blocking. */
  dopt_status (*split)(dopt_comm* comm, int32_t color, int32_t key, dopt_comm** out);

  /** *done = 1 when req has completed (its status is then returned), else 0
   * and DOPT_OK. Non-blocking, thread-safe. */
  dopt_status (*test)(dopt_request* req, int32_t* done);
  /** Block until req completes or timeout_ms passes (< 0: the communicator's
   * own timeout). Returns the operation's status, or DOPT_ERR_TIMEOUT. */
  dopt_status (*wait)(dopt_request* req, int64_t timeout_ms);
  /** Release a request. If it is still running, the operation continues but
   * its result is discarded. NULL is ignored. */
  void (*request_free)(dopt_request* req);
} dopt_communicator_v1;
#define DOPT_COMMUNICATOR_V1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_communicator_v1, request_free)

/** A communicator instance together with its vtable, as handed to reducers
 * and algorithms (borrowed: the host owns it and outlives them). */
typedef struct dopt_comm_ref {
  const dopt_communicator_v1* vt;
  dopt_comm* comm;
} dopt_comm_ref;

#ifdef __cplusplus
}
#endif

#endif /* DISTOPT_COMMUNICATOR_H */
