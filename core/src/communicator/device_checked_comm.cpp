// A communicator interposer (forwarding_comm.hpp) that applies the
// ABI 1.4 device rule before each operation reaches the plugin
// (distopt/device_rule.hpp). The host wraps every communicator it creates
// with it, so the rule holds for the host's own calls and for the
// dopt_comm_ref it hands reducers and algorithms.
#include <utility>

#include "base/services.hpp"
#include "communicator/forwarding_comm.hpp"
#include "distopt/device_rule.hpp"
#include "distopt/registry.hpp"
#include "distopt/watchdog.hpp"

namespace distopt {
namespace {

const char* op_name(comm_wrap::OpKind k) {
  using K = comm_wrap::OpKind;
  switch (k) {
    case K::kAllreduce:
      return "allreduce";
    case K::kReduceScatter:
      return "reduce_scatter";
    case K::kAllgather:
      return "allgather";
    case K::kBroadcast:
      return "broadcast";
    case K::kBarrier:
      return "barrier";
    case K::kSend:
      return "send";
    case K::kRecv:
      return "recv";
  }
  return "operation";
}

// A request whose wait the watchdog watches (distopt/watchdog.hpp): this
// wrapper is outermost, so the host's and the plugins' waits pass here.
class WatchedRequest final : public comm_wrap::ForwardedRequest {
 public:
  WatchedRequest(const std::string& comm, const char* op) : comm_(comm), op_(op) {}
  dopt_status wait(int64_t timeout_ms) override {
    const WatchdogScope watched("communicator", comm_, op_);
    return ForwardedRequest::wait(timeout_ms);
  }

 private:
  const std::string comm_;  // a copy: a request may outlive its communicator
  const char* op_;
};

class DevComm final : public comm_wrap::ForwardingComm {
 public:
  DevComm(dopt_comm_ref inner, std::string name, uint32_t devices)
      : ForwardingComm(inner), name_(std::move(name)), devices_(devices) {}

  // Refused (the error text set) when a tensor is on a device the
  // communicator does not accept; the plugin reports a null tensor itself.
  dopt_status admit(const comm_wrap::Issue& is) override {
    for (const DLTensor* t : {is.a, is.b}) {
      if (!t) continue;
      const std::string why = comm_device_refusal(name_, devices_, *t);
      if (why.empty()) continue;
      set_last_error(why);
      return DOPT_ERR_UNSUPPORTED;
    }
    return DOPT_OK;
  }

  std::unique_ptr<comm_wrap::ForwardedRequest> prepare(const comm_wrap::Issue& is) override {
    if (watchdog_seconds() <= 0) return std::make_unique<comm_wrap::ForwardedRequest>();
    return std::make_unique<WatchedRequest>(name_, op_name(is.kind));
  }

  dopt_comm_ref wrap_child(dopt_comm_ref child, int32_t) override {
    return device_checked_comm(child, name_, devices_);
  }

  std::string no_streams_why() const override {
    return "communicator '" + name_ + "' has no device streams (it accepts " +
           devices_text(devices_) + " memory)";
  }

 private:
  std::string name_;
  uint32_t devices_;
};

}  // namespace

dopt_comm_ref device_checked_comm(dopt_comm_ref inner, const std::string& comm_name,
                                  uint32_t devices) {
  return (new DevComm(inner, comm_name, devices == 0 ? DOPT_DEVICES_DEFAULT : devices))->ref();
}

}  // namespace distopt
