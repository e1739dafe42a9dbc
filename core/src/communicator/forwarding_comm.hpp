// The base of the host's communicator interposers (the collective checker,
// comm_check/checked_comm.cpp; the device rule, device_rule/
// device_checked_comm.cpp): one static dopt_communicator_v1 whose every
// entry forwards to the wrapped communicator's vtable, with hooks where an
// interposer refuses a call, wraps the request it returns, or acts on
// split and destroy. A derived object IS the dopt_comm the vtable receives.
#pragma once

#include <memory>
#include <string>

#include "distopt/communicator.h"

namespace distopt::comm_wrap {

/// Which operation an issuing call is.
enum class OpKind { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kBarrier, kSend, kRecv };

/// The arguments of an issuing call, as the hooks see them.
struct Issue {
  OpKind kind;
  const DLTensor* a = nullptr;  ///< send (collectives), buf (broadcast, send, recv); null: barrier
  const DLTensor* b = nullptr;  ///< recv (allreduce, reduce_scatter, allgather), else null
  int32_t root = -1;            ///< broadcast's root, else -1
  int32_t op = -1;              ///< the dopt_reduce_op of reductions, else -1
};

/// A request issued through a ForwardingComm: forwards to the inner request;
/// an interposer derives to act on wait and test. Freed by request_free.
class ForwardedRequest {
 public:
  virtual ~ForwardedRequest() = default;
  /// The inner request's wait / test (dopt_communicator_v1 semantics).
  virtual dopt_status wait(int64_t timeout_ms) { return vt->wait(inner, timeout_ms); }
  virtual dopt_status test(int32_t* done) { return vt->test(inner, done); }
  /// ABI 1.4: the inner stream_wait, or (host memory only, ABI < 1.4) wait(-1).
  dopt_status stream_wait(void* stream);

  dopt_request* inner = nullptr;  ///< set once the inner call issued it
  const dopt_communicator_v1* vt = nullptr;
};

/// Derive, implement the hooks, and hand out ref(). Thread safety: the
/// vtable entries run on whatever threads the host's callers use; hooks
/// must be safe for that.
class ForwardingComm {
 public:
  explicit ForwardingComm(dopt_comm_ref inner) : inner_(inner) {}
  virtual ~ForwardingComm() = default;
  ForwardingComm(const ForwardingComm&) = delete;
  ForwardingComm& operator=(const ForwardingComm&) = delete;

  /// This object behind the forwarding vtable. Destroying it through the
  /// vtable destroys the inner communicator, then deletes this object.
  dopt_comm_ref ref() { return {vtable(), reinterpret_cast<dopt_comm*>(this)}; }
  const dopt_comm_ref& inner() const { return inner_; }

  /// Hooks (defaults forward unchanged).
  /// Before the call reaches the inner communicator: non-OK refuses it
  /// (the hook sets the host's error text; no request is made).
  virtual dopt_status admit(const Issue&) { return DOPT_OK; }
  /// The request object that will wrap the inner one (made before the
  /// inner call, so that what it records is in issue order).
  virtual std::unique_ptr<ForwardedRequest> prepare(const Issue&) {
    return std::make_unique<ForwardedRequest>();
  }
  /// Before the inner split (a split is a blocking collective).
  virtual void before_split() {}
  /// Wrap the inner communicator's split child (color >= 0) in a new
  /// interposer of the same kind; returns what the caller gets.
  virtual dopt_comm_ref wrap_child(dopt_comm_ref child, int32_t color) = 0;
  /// Before the inner communicator is destroyed.
  virtual void before_destroy() {}
  /// Why set_stream is refused when the inner communicator has none
  /// ("communicator 'tcp' has no device streams (...)").
  virtual std::string no_streams_why() const = 0;

  /// The entries (static: the vtable points at them). `issue` runs admit,
  /// prepare, then `call` (the inner entry), and returns the wrapped request.
  template <class Call>
  dopt_status issue(const Issue& is, Call call, dopt_request** out) {
    *out = nullptr;
    const dopt_status refused = admit(is);
    if (refused != DOPT_OK) return refused;
    std::unique_ptr<ForwardedRequest> r = prepare(is);
    dopt_request* in = nullptr;
    const dopt_status st = call(&in);
    if (st < 0 || !in) return st;
    r->inner = in;
    r->vt = inner_.vt;
    *out = reinterpret_cast<dopt_request*>(r.release());
    return st;
  }

 private:
  static const dopt_communicator_v1* vtable();
  dopt_comm_ref inner_;
};

}  // namespace distopt::comm_wrap
