// C++ owner of a communicator instance made through a plugin's vtable.
#include "distopt/host_communicator.hpp"

#include <utility>

#include "base/services.hpp"
#include "communicator/checked_comm.hpp"
#include "distopt/device_rule.hpp"
#include "distopt/error.hpp"

namespace distopt {
namespace {

// Requests carry "component:operation" so a failure names both.
void throw_request_failure(dopt_status st, const std::string& what) {
  auto colon = what.find(':');
  std::string component = colon == std::string::npos ? "communicator" : what.substr(0, colon);
  std::string op = colon == std::string::npos ? what : what.substr(colon + 1);
  throw CommError(st, component, op, take_last_error());
}

}  // namespace

CommRequest::CommRequest(const dopt_communicator_v1* vt, dopt_request* req, std::string what)
    : vt_(vt), req_(req), what_(std::move(what)) {}

CommRequest::CommRequest(CommRequest&& o) noexcept
    : vt_(o.vt_), req_(std::exchange(o.req_, nullptr)), what_(std::move(o.what_)) {}

CommRequest& CommRequest::operator=(CommRequest&& o) noexcept {
  if (this != &o) {
    if (req_ && vt_) vt_->request_free(req_);
    vt_ = o.vt_;
    req_ = std::exchange(o.req_, nullptr);
    what_ = std::move(o.what_);
  }
  return *this;
}

CommRequest::~CommRequest() {
  if (req_ && vt_) vt_->request_free(req_);
}

void CommRequest::wait(int64_t timeout_ms) {
  if (!req_) return;  // already completed and released, or default-constructed
  dopt_status st = vt_->wait(req_, timeout_ms);
  if (st < 0) throw_request_failure(st, what_);
}

bool CommRequest::test() {
  if (!req_) return true;
  int32_t done = 0;
  dopt_status st = vt_->test(req_, &done);
  if (st < 0) throw_request_failure(st, what_);
  return done != 0;
}

void CommRequest::stream_wait(void* stream) {
  if (!req_) return;
  if (!DOPT_HAS_FIELD(vt_, dopt_communicator_v1, stream_wait) || !vt_->stream_wait) {
    wait();  // ABI < 1.4: host-memory work only
    return;
  }
  dopt_status st = vt_->stream_wait(req_, stream);
  if (st < 0) throw_request_failure(st, what_);
}

Communicator::Communicator(const ComponentInfo& info, const dopt_create_args& args,
                           const CollectiveCheck& check)
    : info_(info), vt_(static_cast<const dopt_communicator_v1*>(info.vtable)) {
  if (info.kind != DOPT_KIND_COMMUNICATOR || !vt_)
    throw PluginError("component '" + info.name + "' is not a communicator");
  take_last_error();
  dopt_status st = vt_->create(&args, &comm_);
  if (st < 0) {
    comm_ = nullptr;
    check_status(st, info_.name, "create");
  }
  if (!comm_) throw ComponentError(DOPT_ERR_INTERNAL, info_.name, "create", "returned no instance");
  if (check.store && check.stall_after.count() > 0) {
    comm_check::Settings s{check.store, std::string(args.scope ? args.scope : "comm") + "/check",
                           info_.name, check.stall_after, check.failure_patience};
    dopt_comm_ref wrapped = comm_check::wrap({vt_, comm_}, std::move(s));
    vt_ = wrapped.vt;
    comm_ = wrapped.comm;
  }
  // Outermost, so that a refused call is neither fingerprinted nor sent.
  dopt_comm_ref checked = device_checked_comm({vt_, comm_}, info_.name, info_.devices);
  vt_ = checked.vt;
  comm_ = checked.comm;
}

Communicator::Communicator(const ComponentInfo& info, dopt_comm* comm)
    : Communicator(
          info, device_checked_comm({static_cast<const dopt_communicator_v1*>(info.vtable), comm},
                                    info.name, info.devices)) {}

Communicator::Communicator(const ComponentInfo& info, dopt_comm_ref wrapped)
    : info_(info), vt_(wrapped.vt), comm_(wrapped.comm) {}

Communicator::~Communicator() {
  if (comm_) {
    dopt_status st = vt_->destroy(comm_);
    if (st < 0) log(DOPT_LOG_WARN, info_.name, "destroy failed: " + take_last_error());
  }
}

int Communicator::rank() const { return vt_->rank(comm_); }
int Communicator::world_size() const { return vt_->world_size(comm_); }

void Communicator::set_stream(void* stream) {
  take_last_error();
  check_status(vt_->set_stream(comm_, stream), info_.name, "set_stream");
}

#define DISTOPT_ISSUE(OPNAME, CALL)                          \
  do {                                                       \
    dopt_request* req = nullptr;                             \
    dopt_status st = CALL;                                   \
    check_status(st, info_.name, OPNAME);                    \
    return CommRequest(vt_, req, info_.name + ":" + OPNAME); \
  } while (0)

CommRequest Communicator::allreduce(const DLTensor& send, DLTensor& recv, dopt_reduce_op op) {
  DISTOPT_ISSUE("allreduce", vt_->allreduce(comm_, &send, &recv, op, &req));
}
CommRequest Communicator::reduce_scatter(const DLTensor& send, DLTensor& recv, dopt_reduce_op op) {
  DISTOPT_ISSUE("reduce_scatter", vt_->reduce_scatter(comm_, &send, &recv, op, &req));
}
CommRequest Communicator::allgather(const DLTensor& send, DLTensor& recv) {
  DISTOPT_ISSUE("allgather", vt_->allgather(comm_, &send, &recv, &req));
}
CommRequest Communicator::broadcast(DLTensor& buf, int root) {
  DISTOPT_ISSUE("broadcast", vt_->broadcast(comm_, &buf, root, &req));
}
CommRequest Communicator::send(const DLTensor& buf, int peer, int tag) {
  DISTOPT_ISSUE("send", vt_->send(comm_, &buf, peer, tag, &req));
}
CommRequest Communicator::recv(DLTensor& buf, int peer, int tag) {
  DISTOPT_ISSUE("recv", vt_->recv(comm_, &buf, peer, tag, &req));
}
CommRequest Communicator::barrier() { DISTOPT_ISSUE("barrier", vt_->barrier(comm_, &req)); }

#undef DISTOPT_ISSUE

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  dopt_comm* out = nullptr;
  dopt_status st = vt_->split(comm_, color, key, &out);
  check_status(st, info_.name, "split");
  if (!out) return nullptr;
  // `out` came through the wrappers' split: it is wrapped like this one.
  return std::unique_ptr<Communicator>(new Communicator(info_, dopt_comm_ref{vt_, out}));
}

DLTensor make_dltensor(void* data, int64_t count, DLDataType dtype, int64_t* shape_storage) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dtype;
  shape_storage[0] = count;
  t.shape = shape_storage;
  t.strides = nullptr;
  t.byte_offset = 0;
  return t;
}

}  // namespace distopt
