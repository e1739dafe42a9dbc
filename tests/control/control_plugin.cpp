// Test-only components for the control communicator: a job whose
// communicator accepts device memory only, carried on a CPU machine (built
// into build/test-plugins/control, never build/plugins, which jobs scan).
//   communicator `device_sim`: declares kDLCUDA only, so the host must give
//     it a host-memory control communicator and never send it kDLCPU
//     memory (the host's device rule refuses that before it is called). Its
//     kDLCUDA tensors are host memory in disguise: it relabels them kDLCPU
//     and forwards every call to a `tcp` instance it creates from the tcp
//     plugin library (DISTOPT_TCP_PLUGIN), so data really moves.
//   reducer `device_mean` (kDLCPU, the host's parameters are on the CPU):
//     the average of a bucket, sent through its communicator as a kDLCUDA
//     tensor, i.e. the gradient traffic a CUDA job would send.
// Torch-free.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::control_test {

/// The `tcp` communicator's vtable, from the tcp plugin library (loaded once,
/// never unloaded: instances may outlive any one device_sim).
const dopt_communicator_v1* tcp_vtable() {
  static const dopt_communicator_v1* vt = [] {
    void* lib = dlopen(DISTOPT_TCP_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw sdk::Error(DOPT_ERR_INTERNAL, std::string("device_sim: cannot load ") +
                                              DISTOPT_TCP_PLUGIN + ": " + dlerror());
    auto init = reinterpret_cast<dopt_plugin_init_v1_fn>(dlsym(lib, DOPT_PLUGIN_ENTRY_V1));
    dopt_plugin_info info{};
    info.struct_size = DOPT_PLUGIN_INFO_STRUCT_SIZE;
    if (!init || init(sdk::host(), &info) != DOPT_OK)
      throw sdk::Error(DOPT_ERR_INTERNAL, "device_sim: the tcp plugin did not initialise");
    for (size_t i = 0; i < info.num_components; ++i) {
      const dopt_component& c = info.components[i];
      if (c.kind == DOPT_KIND_COMMUNICATOR && std::strcmp(c.name, "tcp") == 0)
        return static_cast<const dopt_communicator_v1*>(c.vtable);
    }
    throw sdk::Error(DOPT_ERR_INTERNAL, "device_sim: no tcp communicator in the tcp plugin");
  }();
  return vt;
}

/// A kDLCUDA tensor of this test is host memory: tcp takes it as kDLCPU.
DLTensor as_host(const DLTensor& t) {
  DLTensor h = t;
  if (h.device.device_type == kDLCUDA) h.device = DLDevice{kDLCPU, 0};
  return h;
}

class Forwarded : public sdk::Request {
 public:
  explicit Forwarded(sdk::CommHandle h) : h_(std::move(h)) {}
  bool test() override { return h_.test(); }
  bool wait(int64_t timeout_ms) override {
    h_.wait(timeout_ms);
    return true;
  }

 private:
  sdk::CommHandle h_;
};

class DeviceSimComm : public sdk::Communicator {
 public:
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCUDA);

  explicit DeviceSimComm(const dopt_create_args& args) {
    const dopt_communicator_v1* vt = tcp_vtable();
    dopt_comm* c = nullptr;
    sdk::check(vt->create(&args, &c), "device_sim: tcp create");
    inner_ = sdk::OwnedComm(dopt_comm_ref{vt, c});
  }
  explicit DeviceSimComm(sdk::OwnedComm inner) : inner_(std::move(inner)) {}

  int32_t rank() const override { return inner_.rank(); }
  int32_t world_size() const override { return inner_.world_size(); }
  std::unique_ptr<sdk::Request> allreduce(const DLTensor& send, DLTensor& recv,
                                          dopt_reduce_op op) override {
    DLTensor s = as_host(send), r = as_host(recv);
    return wrap(inner_.view().allreduce(s, r, op));
  }
  std::unique_ptr<sdk::Request> reduce_scatter(const DLTensor& send, DLTensor& recv,
                                               dopt_reduce_op op) override {
    DLTensor s = as_host(send), r = as_host(recv);
    return wrap(inner_.view().reduce_scatter(s, r, op));
  }
  std::unique_ptr<sdk::Request> allgather(const DLTensor& send, DLTensor& recv) override {
    DLTensor s = as_host(send), r = as_host(recv);
    return wrap(inner_.view().allgather(s, r));
  }
  std::unique_ptr<sdk::Request> broadcast(DLTensor& buf, int32_t root) override {
    DLTensor b = as_host(buf);
    return wrap(inner_.view().broadcast(b, root));
  }
  std::unique_ptr<sdk::Request> send(const DLTensor& buf, int32_t peer, int32_t tag) override {
    DLTensor b = as_host(buf);
    return wrap(inner_.view().send(b, peer, tag));
  }
  std::unique_ptr<sdk::Request> recv(DLTensor& buf, int32_t peer, int32_t tag) override {
    DLTensor b = as_host(buf);
    return wrap(inner_.view().recv(b, peer, tag));
  }
  std::unique_ptr<sdk::Request> barrier() override { return wrap(inner_.view().barrier()); }
  std::unique_ptr<sdk::Communicator> split(int32_t color, int32_t key) override {
    sdk::OwnedComm child = inner_.view().split(color, key);
    if (!child) return nullptr;
    return std::make_unique<DeviceSimComm>(std::move(child));
  }
  void set_stream(void*) override {}  // host memory in disguise: nothing to order

 private:
  static std::unique_ptr<sdk::Request> wrap(sdk::CommHandle h) {
    return std::make_unique<Forwarded>(std::move(h));
  }
  sdk::OwnedComm inner_;
};

/// Sends each bucket as a kDLCUDA tensor (AVG): the gradient traffic of a
/// CUDA job. Stateless.
class DeviceMeanReducer : public sdk::Reducer {
 public:
  DeviceMeanReducer(const dopt_create_args&, dopt_comm_ref comm, const dopt_bucket*, size_t)
      : comm_(comm) {}
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override {
    DLTensor t = *bucket.flat;
    t.device = DLDevice{kDLCUDA, 0};  // the claim device_sim accepts; the bytes are host memory
    int64_t n = 1;
    for (int32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
    bytes_ += static_cast<uint64_t>(n) * (t.dtype.bits / 8) * 2 *
              static_cast<uint64_t>(comm_.world_size() - 1) /
              static_cast<uint64_t>(comm_.world_size());
    return std::make_unique<Forwarded>(comm_.allreduce(t, t, DOPT_REDUCE_AVG));
  }
  uint64_t bytes_sent() const override { return bytes_; }
  void save_state(sdk::StateWriter&) override {}
  void load_state(const sdk::StateReader&) override {}

 private:
  sdk::CommView comm_;
  uint64_t bytes_ = 0;
};

// tcp's schema, so that device_sim can hand its options to tcp's create.
constexpr dopt_option_spec kSimOptions[] = {
    sdk::option_double("timeout_s", "60", "as tcp's").range(0.001, 1e7),
    sdk::option_int("chunk_bytes", "262144", "as tcp's").range(4096, 1 << 30),
    sdk::option_int("socket_buffer_bytes", "0", "as tcp's").range(0, 1 << 30),
    sdk::option_int("max_io_bytes", "4194304", "as tcp's").range(4096, 1 << 30),
    sdk::option_bool("shm", "true", "as tcp's"),
    sdk::option_int("shm_bytes", "1048576", "as tcp's").range(65536, 1 << 30),
};

}  // namespace distopt::plugins::control_test

namespace ct = distopt::plugins::control_test;

DOPT_PLUGIN("control_test", "1.0.0",
            DOPT_COMPONENT(ct::DeviceSimComm, "device_sim", "1.0.0",
                           "test-only: accepts kDLCUDA memory only (host memory in disguise, "
                           "carried by tcp)",
                           ct::kSimOptions),
            DOPT_COMPONENT(ct::DeviceMeanReducer, "device_mean", "1.0.0",
                           "test-only: the bucket average, sent as kDLCUDA memory", nullptr))
