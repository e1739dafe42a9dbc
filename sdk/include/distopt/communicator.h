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
 *
 * Device memory (ABI 1.4). A communicator accepts the device types its
 * dopt_component::devices lists (abi.h; none listed: kDLCPU only). The host
 * refuses any other tensor with DOPT_ERR_UNSUPPORTED before the call reaches
 * the plugin ("communicator 'tcp' does not accept kDLCUDA memory"), on its
 * own calls and on every call through the dopt_comm_ref it hands a reducer
 * or an algorithm (and through communicators split from it): nothing is
 * staged implicitly. For kDLCUDA tensors the rules are NCCL's / c10d's:
 *  - Tensors of one call are on one device, the communicator's (its
 *    create-time device; another device_id is INVALID_ARGUMENT).
 *  - Ordering in: each collective (and send / recv) is ordered after all work
 *    the caller enqueued on the communicator's *caller stream* before the
 *    call: the communicator records an event on that stream at the call and
 *    makes its own internal stream wait on it. The caller stream is the one
 *    given to set_stream (NULL, the default: the legacy default stream, which
 *    orders after every blocking stream of the device). The call returns
 *    without waiting for the device.
 *  - Ordering out: each request records a completion event on the
 *    communicator's stream right after its operation. test() queries it
 *    (non-blocking); wait() blocks the calling host thread until the device
 *    work has completed (or failed, or timed out); stream_wait() makes a
 *    stream wait on it without blocking the host (c10d's Work::wait()), so
 *    the caller's later kernels see the result.
 *  - Until then the caller must neither write the tensors (any stream) nor
 *    free them (a stream-ordered allocator counts the free on the freeing
 *    stream: order that stream after the request with stream_wait first).
 *  - Failure and timeouts are the communicator's (e.g. nccl's watchdog
 *    aborts the communicator and fails every pending request); a stream that
 *    waits on a request that fails is released when the communicator aborts
 *    its device work, and the failure is reported by the request's
 *    test / wait (stream_wait itself reports only what is known when it is
 *    called). request_free of a pending device request does not wait: the
 *    operation completes (or is aborted) on the device.
 * Host-memory requests (kDLCPU) are unchanged: set_stream does not apply to
 * them and their stream_wait blocks the host like wait (a stream cannot wait
 * on host work).
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
  /* Not an operation (Vulkan's *_MAX_ENUM): it makes every int32 a value of
   * this type, so that a component handed an unknown op by another build
   * refuses it (INVALID_ARGUMENT) without undefined behaviour in C++. */
  DOPT_REDUCE_OP_MAX_ENUM = 0x7FFFFFFF
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

  /* ---- ABI 1.4: device memory (see "Device memory" above). Read only when
   * struct_size >= DOPT_COMMUNICATOR_V1_4_STRUCT_SIZE and non-NULL; both may
   * be NULL in a communicator that accepts kDLCPU only. Without them a
   * caller has no stream to set, and uses wait() where it would use
   * stream_wait(). ---- */

  /** Set the caller stream (a cudaStream_t of the communicator's device, or
   * NULL for the legacy default stream) that later operations on device
   * memory are ordered after. Applies to operations issued after it returns,
   * from any thread (one per communicator, like c10d's current stream per
   * process group: callers on several streams serialise their calls).
   * Non-blocking. DOPT_ERR_UNSUPPORTED when the communicator has no device
   * streams. Thread-safe. */
  dopt_status (*set_stream)(dopt_comm* comm, void* stream);
  /** Make `stream` (a cudaStream_t of the request's device; NULL: the legacy
   * default stream) wait for req's completion event; returns without
   * blocking the host. Returns the request's error if it has already failed,
   * else DOPT_OK. For a host-memory request: blocks like wait(req, -1) and
   * returns its status. The request stays valid (test / wait / request_free
   * as usual). Thread-safe. */
  dopt_status (*stream_wait)(dopt_request* req, void* stream);
} dopt_communicator_v1;
/** The ABI 1.0 - 1.3 size (up to `request_free`). */
#define DOPT_COMMUNICATOR_V1_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_communicator_v1, request_free)
/** The ABI 1.4 size (up to `stream_wait`). */
#define DOPT_COMMUNICATOR_V1_4_STRUCT_SIZE DOPT_STRUCT_SIZE_UPTO(dopt_communicator_v1, stream_wait)

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
