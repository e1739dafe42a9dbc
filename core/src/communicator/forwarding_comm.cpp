// The forwarding vtable of ForwardingComm (see forwarding_comm.hpp).
#include "communicator/forwarding_comm.hpp"

#include "base/services.hpp"

namespace distopt::comm_wrap {

dopt_status ForwardedRequest::stream_wait(void* stream) {
  if (!DOPT_HAS_FIELD(vt, dopt_communicator_v1, stream_wait) || !vt->stream_wait)
    return wait(-1);  // ABI < 1.4: host-memory requests only
  return vt->stream_wait(inner, stream);
}

namespace {

ForwardingComm* self(dopt_comm* c) { return reinterpret_cast<ForwardingComm*>(c); }
const ForwardingComm* self(const dopt_comm* c) {
  return reinterpret_cast<const ForwardingComm*>(c);
}
ForwardedRequest* req(dopt_request* r) { return reinterpret_cast<ForwardedRequest*>(r); }

// One issuing entry: the Issue it is, then the inner call.
#define DISTOPT_FORWARD(ISSUE, CALL)    \
  ForwardingComm* c = self(comm);       \
  const dopt_comm_ref& in = c->inner(); \
  return c->issue(                      \
      ISSUE, [&](dopt_request** inner) { return in.vt->CALL; }, out)

dopt_status f_allreduce(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_reduce_op op,
                        dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kAllreduce, send, recv, -1, op}),
                  allreduce(in.comm, send, recv, op, inner));
}
dopt_status f_reduce_scatter(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                             dopt_reduce_op op, dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kReduceScatter, send, recv, -1, op}),
                  reduce_scatter(in.comm, send, recv, op, inner));
}
dopt_status f_allgather(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kAllgather, send, recv, -1, -1}),
                  allgather(in.comm, send, recv, inner));
}
dopt_status f_broadcast(dopt_comm* comm, DLTensor* buf, int32_t root, dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kBroadcast, buf, nullptr, root, -1}),
                  broadcast(in.comm, buf, root, inner));
}
dopt_status f_barrier(dopt_comm* comm, dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kBarrier}), barrier(in.comm, inner));
}
dopt_status f_send(dopt_comm* comm, const DLTensor* buf, int32_t peer, int32_t tag,
                   dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kSend, buf}), send(in.comm, buf, peer, tag, inner));
}
dopt_status f_recv(dopt_comm* comm, DLTensor* buf, int32_t peer, int32_t tag, dopt_request** out) {
  DISTOPT_FORWARD((Issue{OpKind::kRecv, buf}), recv(in.comm, buf, peer, tag, inner));
}
#undef DISTOPT_FORWARD

dopt_status f_test(dopt_request* r, int32_t* done) { return req(r)->test(done); }
dopt_status f_wait(dopt_request* r, int64_t timeout_ms) { return req(r)->wait(timeout_ms); }
dopt_status f_stream_wait(dopt_request* r, void* stream) { return req(r)->stream_wait(stream); }
void f_request_free(dopt_request* rq) {
  if (!rq) return;
  ForwardedRequest* r = req(rq);
  r->vt->request_free(r->inner);
  delete r;
}

dopt_status f_set_stream(dopt_comm* comm, void* stream) {
  const dopt_comm_ref& in = self(comm)->inner();
  if (!DOPT_HAS_FIELD(in.vt, dopt_communicator_v1, set_stream) || !in.vt->set_stream) {
    set_last_error(self(comm)->no_streams_why());
    return DOPT_ERR_UNSUPPORTED;
  }
  return in.vt->set_stream(in.comm, stream);
}

int32_t f_rank(const dopt_comm* comm) {
  return self(comm)->inner().vt->rank(self(comm)->inner().comm);
}
int32_t f_world_size(const dopt_comm* comm) {
  return self(comm)->inner().vt->world_size(self(comm)->inner().comm);
}

dopt_status f_destroy(dopt_comm* comm) {
  ForwardingComm* c = self(comm);
  c->before_destroy();
  const dopt_status st = c->inner().vt->destroy(c->inner().comm);
  delete c;
  return st;
}

dopt_status f_split(dopt_comm* comm, int32_t color, int32_t key, dopt_comm** out) {
  ForwardingComm* c = self(comm);
  c->before_split();
  dopt_comm* child = nullptr;
  const dopt_status st = c->inner().vt->split(c->inner().comm, color, key, &child);
  *out = nullptr;
  if (st < 0 || !child) return st;
  *out = c->wrap_child({c->inner().vt, child}, color).comm;
  return st;
}

dopt_communicator_v1 make_vtable() {
  dopt_communicator_v1 v{};
  v.struct_size = DOPT_COMMUNICATOR_V1_4_STRUCT_SIZE;
  v.create = nullptr;  // instances come from the interposers' wrap functions
  v.destroy = f_destroy;
  v.rank = f_rank;
  v.world_size = f_world_size;
  v.allreduce = f_allreduce;
  v.reduce_scatter = f_reduce_scatter;
  v.allgather = f_allgather;
  v.broadcast = f_broadcast;
  v.send = f_send;
  v.recv = f_recv;
  v.barrier = f_barrier;
  v.split = f_split;
  v.test = f_test;
  v.wait = f_wait;
  v.request_free = f_request_free;
  v.set_stream = f_set_stream;
  v.stream_wait = f_stream_wait;
  return v;
}

const dopt_communicator_v1 kVtable = make_vtable();

}  // namespace

const dopt_communicator_v1* ForwardingComm::vtable() { return &kVtable; }

}  // namespace distopt::comm_wrap
