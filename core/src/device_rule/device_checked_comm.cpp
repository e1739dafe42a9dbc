// A communicator vtable that applies the ABI 1.4 device rule before each
// operation reaches the plugin (distopt/device_rule.hpp). The host wraps
// every communicator it creates with it, so the rule holds for the host's
// own calls and for the dopt_comm_ref it hands reducers and algorithms.
#include <utility>

#include "distopt/device_rule.hpp"
#include "distopt/host_api.hpp"
#include "distopt/registry.hpp"

namespace distopt {
namespace {

struct DevComm {
  dopt_comm_ref inner;
  std::string name;
  uint32_t devices;
};

// Requests are wrapped so that the vtable can stay static (a request outlives
// no communicator, but a static table outlives every request).
struct DevRequest {
  dopt_request* inner;
  const dopt_communicator_v1* vt;
};

DevComm* self(dopt_comm* c) { return reinterpret_cast<DevComm*>(c); }
const DevComm* self(const dopt_comm* c) { return reinterpret_cast<const DevComm*>(c); }
DevRequest* req(dopt_request* r) { return reinterpret_cast<DevRequest*>(r); }

// True (error sink set, *out cleared) when `t` is on a device `c` refuses.
bool refused(const DevComm* c, const DLTensor* t, dopt_request** out) {
  if (!t) return false;  // the plugin reports its own INVALID_ARGUMENT
  const std::string why = comm_device_refusal(c->name, c->devices, *t);
  if (why.empty()) return false;
  host_api()->set_error(why.c_str());
  if (out) *out = nullptr;
  return true;
}

dopt_status issued(dopt_status st, dopt_request* inner, const DevComm* c, dopt_request** out) {
  if (st < 0 || !inner) {
    *out = nullptr;
    return st;
  }
  *out = reinterpret_cast<dopt_request*>(new DevRequest{inner, c->inner.vt});
  return st;
}

#define DISTOPT_DEV_ISSUE(CALL)             \
  const DevComm* c = self(comm);            \
  dopt_request* inner = nullptr;            \
  const dopt_status st = c->inner.vt->CALL; \
  return issued(st, inner, c, out)

dopt_status c_allreduce(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_reduce_op op,
                        dopt_request** out) {
  if (refused(self(comm), send, out) || refused(self(comm), recv, out)) return DOPT_ERR_UNSUPPORTED;
  DISTOPT_DEV_ISSUE(allreduce(c->inner.comm, send, recv, op, &inner));
}
dopt_status c_reduce_scatter(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                             dopt_reduce_op op, dopt_request** out) {
  if (refused(self(comm), send, out) || refused(self(comm), recv, out)) return DOPT_ERR_UNSUPPORTED;
  DISTOPT_DEV_ISSUE(reduce_scatter(c->inner.comm, send, recv, op, &inner));
}
dopt_status c_allgather(dopt_comm* comm, const DLTensor* send, DLTensor* recv, dopt_request** out) {
  if (refused(self(comm), send, out) || refused(self(comm), recv, out)) return DOPT_ERR_UNSUPPORTED;
  DISTOPT_DEV_ISSUE(allgather(c->inner.comm, send, recv, &inner));
}
dopt_status c_broadcast(dopt_comm* comm, DLTensor* buf, int32_t root, dopt_request** out) {
  if (refused(self(comm), buf, out)) return DOPT_ERR_UNSUPPORTED;
  DISTOPT_DEV_ISSUE(broadcast(c->inner.comm, buf, root, &inner));
}
dopt_status c_send(dopt_comm* comm, const DLTensor* buf, int32_t peer, int32_t tag,
                   dopt_request** out) {
  if (refused(self(comm), buf, out)) return DOPT_ERR_UNSUPPORTED;
  DISTOPT_DEV_ISSUE(send(c->inner.comm, buf, peer, tag, &inner));
}
dopt_status c_recv(dopt_comm* comm, DLTensor* buf, int32_t peer, int32_t tag, dopt_request** out) {
  if (refused(self(comm), buf, out)) return DOPT_ERR_UNSUPPORTED;
  DISTOPT_DEV_ISSUE(recv(c->inner.comm, buf, peer, tag, &inner));
}
dopt_status c_barrier(dopt_comm* comm, dopt_request** out) {
  DISTOPT_DEV_ISSUE(barrier(c->inner.comm, &inner));
}
#undef DISTOPT_DEV_ISSUE

dopt_status c_test(dopt_request* rq, int32_t* done) {
  return req(rq)->vt->test(req(rq)->inner, done);
}
dopt_status c_wait(dopt_request* rq, int64_t timeout_ms) {
  return req(rq)->vt->wait(req(rq)->inner, timeout_ms);
}
void c_request_free(dopt_request* rq) {
  if (!rq) return;
  DevRequest* r = req(rq);
  r->vt->request_free(r->inner);
  delete r;
}
dopt_status c_stream_wait(dopt_request* rq, void* stream) {
  DevRequest* r = req(rq);
  if (!DOPT_HAS_FIELD(r->vt, dopt_communicator_v1, stream_wait) || !r->vt->stream_wait)
    return r->vt->wait(r->inner, -1);  // ABI < 1.4: host-memory requests only
  return r->vt->stream_wait(r->inner, stream);
}

dopt_status c_set_stream(dopt_comm* comm, void* stream) {
  const DevComm* c = self(comm);
  const dopt_communicator_v1* vt = c->inner.vt;
  if (!DOPT_HAS_FIELD(vt, dopt_communicator_v1, set_stream) || !vt->set_stream) {
    host_api()->set_error(("communicator '" + c->name + "' has no device streams (it accepts " +
                           devices_text(c->devices) + " memory)")
                              .c_str());
    return DOPT_ERR_UNSUPPORTED;
  }
  return vt->set_stream(c->inner.comm, stream);
}

int32_t c_rank(const dopt_comm* comm) { return self(comm)->inner.vt->rank(self(comm)->inner.comm); }
int32_t c_world_size(const dopt_comm* comm) {
  return self(comm)->inner.vt->world_size(self(comm)->inner.comm);
}

dopt_status c_destroy(dopt_comm* comm) {
  DevComm* c = self(comm);
  const dopt_status st = c->inner.vt->destroy(c->inner.comm);
  delete c;
  return st;
}

dopt_status c_split(dopt_comm* comm, int32_t color, int32_t key, dopt_comm** out) {
  const DevComm* c = self(comm);
  dopt_comm* child = nullptr;
  const dopt_status st = c->inner.vt->split(c->inner.comm, color, key, &child);
  *out = nullptr;
  if (st < 0 || !child) return st;
  *out = device_checked_comm({c->inner.vt, child}, c->name, c->devices).comm;
  return st;
}

dopt_communicator_v1 make_vtable() {
  dopt_communicator_v1 v{};
  v.struct_size = DOPT_COMMUNICATOR_V1_4_STRUCT_SIZE;
  v.create = nullptr;  // instances come from device_checked_comm()
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

dopt_comm_ref device_checked_comm(dopt_comm_ref inner, const std::string& comm_name,
                                  uint32_t devices) {
  auto* c = new DevComm{inner, comm_name, devices == 0 ? DOPT_DEVICES_DEFAULT : devices};
  return {&kVtable, reinterpret_cast<dopt_comm*>(c)};
}

}  // namespace distopt
