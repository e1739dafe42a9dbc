// C++ views of the borrowed communicator a reducer / algorithm is handed
// (dopt_comm_ref): RAII requests whose failures throw
// sdk::Error::reported (the callee already filled the host's error sink, so
// the detail, e.g. which peer died, reaches the user unchanged). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "distopt/communicator.h"
#include "distopt/sdk/base/host.hpp"
// The borrowed reducer's view lived here until ABI 1.6; still reachable.
#include "distopt/sdk/base/reducer_view.hpp"

namespace distopt::sdk {

/// Owns one dopt_request of a borrowed communicator. Move-only; the destructor
/// frees it (a still-running operation continues, its result discarded).
class CommHandle {
 public:
  CommHandle() = default;
  CommHandle(const dopt_communicator_v1* vt, dopt_request* req) : vt_(vt), req_(req) {}
  CommHandle(CommHandle&& o) noexcept : vt_(o.vt_), req_(std::exchange(o.req_, nullptr)) {}
  CommHandle& operator=(CommHandle&& o) noexcept {
    if (this != &o) {
      reset();
      vt_ = o.vt_;
      req_ = std::exchange(o.req_, nullptr);
    }
    return *this;
  }
  ~CommHandle() { reset(); }
  bool valid() const noexcept { return req_ != nullptr; }
  /// Block until done (timeout_ms < 0: the communicator's timeout); throws on
  /// failure or timeout.
  void wait(int64_t timeout_ms = -1) {
    if (!req_) return;
    check(vt_->wait(req_, timeout_ms), "communicator wait");
  }
  /// Non-blocking; true when done; throws on failure.
  bool test() {
    if (!req_) return true;
    int32_t done = 0;
    check(vt_->test(req_, &done), "communicator test");
    return done != 0;
  }
  /// ABI 1.4 (distopt/communicator.h, "Device memory"): make `stream` (a
  /// cudaStream_t; nullptr: the legacy default stream) wait for the
  /// operation without blocking the host. A communicator of ABI < 1.4 (or
  /// one without stream_wait) has host-memory requests only: this waits
  /// like wait(). Throws on a failure already known, or on wait's errors.
  void stream_wait(void* stream) {
    if (!req_) return;
    if (DOPT_HAS_FIELD(vt_, dopt_communicator_v1, stream_wait) && vt_->stream_wait)
      check(vt_->stream_wait(req_, stream), "communicator stream_wait");
    else
      wait();
  }
  void reset() noexcept {
    if (req_ && vt_) vt_->request_free(req_);
    req_ = nullptr;
  }

 private:
  const dopt_communicator_v1* vt_ = nullptr;
  dopt_request* req_ = nullptr;
};

class OwnedComm;

/// A borrowed communicator (not owned; the host keeps it alive).
class CommView {
 public:
  CommView() = default;
  explicit CommView(dopt_comm_ref ref) : ref_(ref) {}
  int32_t rank() const { return ref_.vt->rank(ref_.comm); }
  int32_t world_size() const { return ref_.vt->world_size(ref_.comm); }
  dopt_comm_ref ref() const { return ref_; }
  /// ABI 1.4: the caller stream later device-memory operations are ordered
  /// after (distopt/communicator.h, "Device memory"). Throws
  /// sdk::Error(DOPT_ERR_UNSUPPORTED) when the communicator has no
  /// set_stream (ABI < 1.4, or host memory only), or what it reports.
  void set_stream(void* stream) {
    if (!DOPT_HAS_FIELD(ref_.vt, dopt_communicator_v1, set_stream) || !ref_.vt->set_stream)
      throw Error(DOPT_ERR_UNSUPPORTED,
                  "set_stream: the communicator has no device streams (ABI < 1.4 or host "
                  "memory only)");
    check(ref_.vt->set_stream(ref_.comm, stream), "set_stream");
  }

  CommHandle allreduce(const DLTensor& send, DLTensor& recv, dopt_reduce_op op) {
    dopt_request* r = nullptr;
    check(ref_.vt->allreduce(ref_.comm, &send, &recv, op, &r), "allreduce");
    return {ref_.vt, r};
  }
  CommHandle reduce_scatter(const DLTensor& send, DLTensor& recv, dopt_reduce_op op) {
    dopt_request* r = nullptr;
    check(ref_.vt->reduce_scatter(ref_.comm, &send, &recv, op, &r), "reduce_scatter");
    return {ref_.vt, r};
  }
  CommHandle allgather(const DLTensor& send, DLTensor& recv) {
    dopt_request* r = nullptr;
    check(ref_.vt->allgather(ref_.comm, &send, &recv, &r), "allgather");
    return {ref_.vt, r};
  }
  CommHandle broadcast(DLTensor& buf, int32_t root) {
    dopt_request* r = nullptr;
    check(ref_.vt->broadcast(ref_.comm, &buf, root, &r), "broadcast");
    return {ref_.vt, r};
  }
  CommHandle send(const DLTensor& buf, int32_t peer, int32_t tag) {
    dopt_request* r = nullptr;
    check(ref_.vt->send(ref_.comm, &buf, peer, tag, &r), "send");
    return {ref_.vt, r};
  }
  CommHandle recv(DLTensor& buf, int32_t peer, int32_t tag) {
    dopt_request* r = nullptr;
    check(ref_.vt->recv(ref_.comm, &buf, peer, tag, &r), "recv");
    return {ref_.vt, r};
  }
  CommHandle barrier() {
    dopt_request* r = nullptr;
    check(ref_.vt->barrier(ref_.comm, &r), "barrier");
    return {ref_.vt, r};
  }
  /// Collective over this communicator (every rank calls it, in the same
  /// order as its other collectives; blocking): the ranks that pass the same
  /// color >= 0 form a new communicator, ranked by (key, old rank). Returns
  /// an empty OwnedComm for color < 0. The new communicator belongs to the
  /// caller and must be destroyed before this one (OwnedComm does it).
  /// Throws sdk::Error::reported when the communicator fails (timeout, dead
  /// peer) or does not implement split (UNSUPPORTED).
  inline OwnedComm split(int32_t color, int32_t key);

 private:
  dopt_comm_ref ref_{nullptr, nullptr};
};

/// A communicator this component made (CommView::split) and must destroy:
/// the destructor calls the vtable's destroy, which aborts requests still
/// pending on it. Move-only; empty when split returned none (color < 0).
class OwnedComm {
 public:
  OwnedComm() = default;
  explicit OwnedComm(dopt_comm_ref ref) : ref_(ref) {}
  OwnedComm(OwnedComm&& o) noexcept
      : ref_(std::exchange(o.ref_, dopt_comm_ref{nullptr, nullptr})) {}
  OwnedComm& operator=(OwnedComm&& o) noexcept {
    if (this != &o) {
      reset();
      ref_ = std::exchange(o.ref_, dopt_comm_ref{nullptr, nullptr});
    }
    return *this;
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  ~OwnedComm() { reset(); }

  /// Whether it holds a communicator (false after split with color < 0).
  explicit operator bool() const noexcept { return ref_.comm != nullptr; }
  /// The communicator, borrowed from this owner (valid while it lives).
  CommView view() const { return CommView(ref_); }
  int32_t rank() const { return view().rank(); }
  int32_t world_size() const { return view().world_size(); }
  /// Destroy the communicator now (no-op when empty).
  void reset() noexcept {
    if (ref_.comm && ref_.vt) ref_.vt->destroy(ref_.comm);
    ref_ = {nullptr, nullptr};
  }

 private:
  dopt_comm_ref ref_{nullptr, nullptr};
};

OwnedComm CommView::split(int32_t color, int32_t key) {
  dopt_comm* out = nullptr;
  check(ref_.vt->split(ref_.comm, color, key, &out), "split");
  return OwnedComm(dopt_comm_ref{ref_.vt, out});
}

}  // namespace distopt::sdk
