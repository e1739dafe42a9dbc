#include "comm_check/checked_comm.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "comm_check/fingerprint.hpp"
#include "comm_check/mismatch_detector.hpp"
#include "distopt/host_api.hpp"
#include "distopt/sdk/traffic.hpp"

namespace distopt::comm_check {
namespace {

struct CheckedComm {
  dopt_comm_ref inner;
  Settings settings;
  std::shared_ptr<MismatchDetector> detector;
  std::mutex mu;  // sequence counters: collectives may be issued from several threads
  uint64_t seq = 0;
  uint64_t kind_seq[6] = {0, 0, 0, 0, 0, 0};
  int splits = 0;
  Fingerprint last;  // the latest collective issued
};

struct CheckedRequest {
  dopt_request* inner = nullptr;
  const dopt_communicator_v1* vt = nullptr;
  std::shared_ptr<MismatchDetector> detector;  // null: point-to-point (not checked)
  std::chrono::milliseconds stall_after{0};
  Fingerprint fp;
};

CheckedComm* self(dopt_comm* c) { return reinterpret_cast<CheckedComm*>(c); }
CheckedComm* self(const dopt_comm* c) {
  return reinterpret_cast<CheckedComm*>(const_cast<dopt_comm*>(c));
}
CheckedRequest* req(dopt_request* r) { return reinterpret_cast<CheckedRequest*>(r); }

enum Kind { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kBarrier, kSplit };
const char* kKindNames[] = {"allreduce", "reduce_scatter", "allgather",
                            "broadcast", "barrier",        "split"};

Fingerprint next_fingerprint(CheckedComm* c, Kind kind, const DLTensor* t, int32_t root,
                             int32_t op) {
  Fingerprint f;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    f.seq = ++c->seq;
    f.kind_seq = ++c->kind_seq[kind];
    f.kind = kKindNames[kind];
    f.count = t ? static_cast<int64_t>(sdk::dl_numel(*t)) : 0;
    if (t) f.dtype = t->dtype;
    f.root = root;
    f.op = op;
    c->last = f;
  }
  return f;
}

/// Wrap the request an issuing call returned (nothing to wrap on failure).
dopt_status issued(dopt_status st, dopt_request* inner, const dopt_communicator_v1* vt,
                   std::shared_ptr<MismatchDetector> det, std::chrono::milliseconds after,
                   Fingerprint fp, dopt_request** out) {
  if (st < 0 || !inner) {
    *out = nullptr;
    return st;
  }
  auto* r = new CheckedRequest{inner, vt, std::move(det), after, std::move(fp)};
  *out = reinterpret_cast<dopt_request*>(r);
  return st;
}

#define DISTOPT_CHECKED(KIND, T, ROOT, OP, CALL)           \
  CheckedComm* c = self(comm);                             \
  Fingerprint fp = next_fingerprint(c, KIND, T, ROOT, OP); \
  dopt_request* inner = nullptr;                           \
  dopt_status st = CALL;                                   \
  return issued(st, inner, c->inner.vt, c->detector, c->settings.stall_after, std::move(fp), out)

dopt_status c_allreduce(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_reduce_op op,
                        dopt_request** out) {
  DISTOPT_CHECKED(kAllreduce, send, -1, op,
                  c->inner.vt->allreduce(c->inner.comm, send, recv, op, &inner));
}
dopt_status c_reduce_scatter(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                             dopt_reduce_op op, dopt_request** out) {
  DISTOPT_CHECKED(kReduceScatter, send, -1, op,
                  c->inner.vt->reduce_scatter(c->inner.comm, send, recv, op, &inner));
}
dopt_status c_allgather(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_request** out) {
  DISTOPT_CHECKED(kAllgather, send, -1, -1,
                  c->inner.vt->allgather(c->inner.comm, send, recv, &inner));
}
dopt_status c_broadcast(dopt_comm* comm, DLTensor* buf, int32_t root, dopt_request** out) {
  DISTOPT_CHECKED(kBroadcast, buf, root, -1,
                  c->inner.vt->broadcast(c->inner.comm, buf, root, &inner));
}
dopt_status c_barrier(dopt_comm* comm, dopt_request** out) {
  DISTOPT_CHECKED(kBarrier, nullptr, -1, -1, c->inner.vt->barrier(c->inner.comm, &inner));
}
#undef DISTOPT_CHECKED

dopt_status c_send(dopt_comm* comm, const DLTensor* buf, int32_t peer, int32_t tag,
                   dopt_request** out) {
  CheckedComm* c = self(comm);
  dopt_request* inner = nullptr;
  dopt_status st = c->inner.vt->send(c->inner.comm, buf, peer, tag, &inner);
  return issued(st, inner, c->inner.vt, nullptr, {}, {}, out);
}
dopt_status c_recv(dopt_comm* comm, DLTensor* buf, int32_t peer, int32_t tag, dopt_request** out) {
  CheckedComm* c = self(comm);
  dopt_request* inner = nullptr;
  dopt_status st = c->inner.vt->recv(c->inner.comm, buf, peer, tag, &inner);
  return issued(st, inner, c->inner.vt, nullptr, {}, {}, out);
}

/// Replace the plugin's error detail by the detector's account, if it has
/// one; waits up to `patience` for the other ranks' posts.
void explain(CheckedRequest* r, std::chrono::milliseconds patience) {
  const std::string why = r->detector->explain_failure(r->fp, patience);
  if (why.empty()) return;
  const std::string detail = take_last_error();
  host_api()->set_error((why + " [" + detail + "]").c_str());
}

/// How long a failed collective waits for the other ranks' posts: a peer in
/// another collective posts after one interval; a dead peer never does, so
/// the wait is capped (launchers give survivors kFailurePatienceCap + 1 s).
std::chrono::milliseconds failure_patience(std::chrono::milliseconds interval) {
  return std::min(interval, std::chrono::milliseconds(kFailurePatienceCapMs));
}

dopt_status c_wait(dopt_request* rq, int64_t timeout_ms) {
  CheckedRequest* r = req(rq);
  if (!r->detector) return r->vt->wait(r->inner, timeout_ms);
  const auto start = std::chrono::steady_clock::now();
  bool stalled = false;
  for (;;) {
    int64_t slice = r->stall_after.count();
    const int64_t spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
    if (timeout_ms >= 0) slice = std::max<int64_t>(0, std::min(slice, timeout_ms - spent));
    dopt_status st = r->vt->wait(r->inner, slice);
    int32_t done = 1;
    if (st == DOPT_ERR_TIMEOUT) {
      take_last_error();  // "not complete after waiting": ours to decide
      const dopt_status t = r->vt->test(r->inner, &done);
      if (done) st = t;
    }
    if (done) {
      if (st < 0)
        explain(r, failure_patience(r->stall_after));  // keeps this rank's post
      else if (stalled)
        r->detector->on_wait_done();
      return st;
    }
    if (timeout_ms >= 0 && spent + slice >= timeout_ms) {
      host_api()->set_error(
          (r->fp.describe() + ": not complete after waiting " + std::to_string(timeout_ms) + " ms")
              .c_str());
      return DOPT_ERR_TIMEOUT;
    }
    stalled = true;
    const std::string mismatch = r->detector->on_stall(r->fp);
    if (!mismatch.empty()) {
      host_api()->set_error(mismatch.c_str());
      return DOPT_ERR_COMM;
    }
  }
}

dopt_status c_test(dopt_request* rq, int32_t* done) {
  CheckedRequest* r = req(rq);
  const dopt_status st = r->vt->test(r->inner, done);
  if (st < 0 && r->detector) explain(r, std::chrono::milliseconds(0));  // test() does not wait
  return st;
}

// ABI 1.4: forwarded (device work is not fingerprinted on the stream: a
// mismatch shows up in a later host wait or test).
dopt_status c_stream_wait(dopt_request* rq, void* stream) {
  CheckedRequest* r = req(rq);
  if (!DOPT_HAS_FIELD(r->vt, dopt_communicator_v1, stream_wait) || !r->vt->stream_wait)
    return c_wait(rq, -1);  // host-memory requests only
  return r->vt->stream_wait(r->inner, stream);
}

dopt_status c_set_stream(dopt_comm* comm, void* stream) {
  CheckedComm* c = self(comm);
  if (!DOPT_HAS_FIELD(c->inner.vt, dopt_communicator_v1, set_stream) || !c->inner.vt->set_stream) {
    host_api()->set_error(("communicator '" + c->settings.comm_name +
                           "' has no device streams (set_stream is ABI 1.4)")
                              .c_str());
    return DOPT_ERR_UNSUPPORTED;
  }
  return c->inner.vt->set_stream(c->inner.comm, stream);
}

void c_request_free(dopt_request* rq) {
  if (!rq) return;
  CheckedRequest* r = req(rq);
  r->vt->request_free(r->inner);
  delete r;
}

int32_t c_rank(const dopt_comm* comm) { return self(comm)->inner.vt->rank(self(comm)->inner.comm); }
int32_t c_world_size(const dopt_comm* comm) {
  return self(comm)->inner.vt->world_size(self(comm)->inner.comm);
}

dopt_status c_destroy(dopt_comm* comm) {
  CheckedComm* c = self(comm);
  Fingerprint last;
  uint64_t issued_count = 0;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    issued_count = c->seq;
    last = c->last;
  }
  c->detector->on_leave(issued_count, last);
  const dopt_status st = c->inner.vt->destroy(c->inner.comm);
  delete c;
  return st;
}

dopt_status c_split(dopt_comm* comm, int32_t color, int32_t key, dopt_comm** out) {
  CheckedComm* c = self(comm);
  next_fingerprint(c, kSplit, nullptr, -1, -1);  // blocking: counted, never waited on
  dopt_comm* child = nullptr;
  dopt_status st = c->inner.vt->split(c->inner.comm, color, key, &child);
  *out = nullptr;
  if (st < 0 || !child) return st;
  Settings s = c->settings;
  s.prefix += "/split" + std::to_string(++c->splits) + "." + std::to_string(color);
  *out = wrap({c->inner.vt, child}, std::move(s)).comm;
  return st;
}

dopt_communicator_v1 make_vtable() {
  dopt_communicator_v1 v{};
  v.struct_size = DOPT_COMMUNICATOR_V1_4_STRUCT_SIZE;
  v.create = nullptr;  // instances come from wrap()
  v.destroy = c_destroy;
  v.rank = c_rank;
  v.world_size = c_world_size;
  v.allreduce = c_allreduce;
  v.reduce_scatter = c_reduce_scatter;
  v.allgather = c_allgather;
  v.broadcast = c_broadcast;
  v.send = c_send;
  v.recv = c_recv;
  v.barrier = c_barrier;
  v.split = c_split;
  v.test = c_test;
  v.wait = c_wait;
  v.request_free = c_request_free;
  v.set_stream = c_set_stream;
  v.stream_wait = c_stream_wait;
  return v;
}

const dopt_communicator_v1 kVtable = make_vtable();

}  // namespace

dopt_comm_ref wrap(dopt_comm_ref inner, Settings settings) {
  auto* c = new CheckedComm;
  c->inner = inner;
  c->settings = std::move(settings);
  c->detector = std::make_shared<MismatchDetector>(
      c->settings.store, c->settings.prefix, inner.vt->rank(inner.comm),
      inner.vt->world_size(inner.comm), c->settings.comm_name);
  return {&kVtable, reinterpret_cast<dopt_comm*>(c)};
}

}  // namespace distopt::comm_check
