// ABI glue of the `tcp` communicator: the option schema, the vtable, and the
// one exported entry point. Every function here is noexcept and turns C++
// errors into a status plus a message in the host's error sink.
#include <new>

#include "comm.hpp"
#include "distopt/communicator.h"
#include "distopt/sdk/options.hpp"
#include "host.hpp"

namespace distopt::plugins::tcp {

const dopt_host_api* g_host = nullptr;

namespace {

namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_double("timeout_s", "60",
                       "seconds any operation (and connecting) may take before it fails with "
                       "TIMEOUT")
        .range(0.001, 1e7),
    sdk::option_int("chunk_bytes", "262144",
                    "pipeline grain of reductions: bytes received into a cache-sized window "
                    "before being reduced")
        .range(4096, 1 << 30),
    sdk::option_int("socket_buffer_bytes", "0",
                    "SO_SNDBUF/SO_RCVBUF of data connections; 0 leaves the kernel's autotuning on")
        .range(0, 1 << 30),
    sdk::option_int("max_io_bytes", "4194304", "largest single send()/recv() call")
        .range(4096, 1 << 30),
    sdk::option_bool("shm", "true",
                     "run allreduce, reduce_scatter, allgather and broadcast over shared memory "
                     "when every rank is on one host (TCP if any rank says false)"),
    sdk::option_int("shm_bytes", "1048576",
                    "shared-memory segment per rank (two slots that tensors stream through)")
        .range(65536, 1 << 30),
};

template <class F>
dopt_status guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const ApiError& e) {
    set_error(e.msg);
    return e.status;
  } catch (const std::bad_alloc&) {
    set_error("tcp: out of memory");
    return DOPT_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    set_error(std::string("tcp: internal error: ") + e.what());
    return DOPT_ERR_INTERNAL;
  } catch (...) {
    set_error("tcp: unknown internal error");
    return DOPT_ERR_INTERNAL;
  }
}

TcpComm* impl(const dopt_comm* c) {
  if (!c || !c->impl) throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "tcp: NULL communicator"};
  return c->impl;
}

dopt_status give(std::shared_ptr<Request> r, dopt_request** out) {
  if (!out) throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "tcp: NULL request pointer"};
  *out = new dopt_request{std::move(r)};
  return DOPT_OK;
}

Config read_config(const dopt_options* o) {
  Config c;
  if (!o) return c;  // no options object: the schema's defaults
  auto get_d = [&](const char* n, double& v) {
    if (g_host->option_double(o, n, &v) != DOPT_OK)
      throw ApiError{DOPT_ERR_INVALID_ARGUMENT, std::string("tcp: option ") + n};
  };
  auto get_i = [&](const char* n, int64_t& v) {
    if (g_host->option_int(o, n, &v) != DOPT_OK)
      throw ApiError{DOPT_ERR_INVALID_ARGUMENT, std::string("tcp: option ") + n};
  };
  get_d("timeout_s", c.timeout_s);
  get_i("chunk_bytes", c.chunk_bytes);
  get_i("socket_buffer_bytes", c.socket_buffer_bytes);
  get_i("max_io_bytes", c.max_io_bytes);
  int32_t shm = 1;
  if (g_host->option_bool(o, "shm", &shm) != DOPT_OK)
    throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "tcp: option shm"};
  c.shm = shm != 0;
  get_i("shm_bytes", c.shm_bytes);
  return c;
}

dopt_status c_create(const dopt_create_args* args, dopt_comm** out) noexcept {
  return guarded([&] {
    if (!args || !out) throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "create: NULL args or out"};
    if (args->struct_size < DOPT_CREATE_ARGS_STRUCT_SIZE)
      throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "create: dopt_create_args is smaller than v1.0's"};
    *out = nullptr;
    TcpComm* c = TcpComm::create(*args, read_config(args->options));
    *out = new dopt_comm{c};
    return DOPT_OK;
  });
}

dopt_status c_destroy(dopt_comm* c) noexcept {
  return guarded([&] {
    if (!c) return DOPT_OK;
    delete c->impl;
    delete c;
    return DOPT_OK;
  });
}

int32_t c_rank(const dopt_comm* c) noexcept { return c && c->impl ? c->impl->rank() : -1; }
int32_t c_world_size(const dopt_comm* c) noexcept {
  return c && c->impl ? c->impl->world_size() : -1;
}

dopt_status c_allreduce(dopt_comm* c, const DLTensor* s, DLTensor* r, dopt_reduce_op op,
                        dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->allreduce(s, r, op), q); });
}
dopt_status c_reduce_scatter(dopt_comm* c, const DLTensor* s, DLTensor* r, dopt_reduce_op op,
                             dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->reduce_scatter(s, r, op), q); });
}
dopt_status c_allgather(dopt_comm* c, const DLTensor* s, DLTensor* r, dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->allgather(s, r), q); });
}
dopt_status c_broadcast(dopt_comm* c, DLTensor* b, int32_t root, dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->broadcast(b, root), q); });
}
dopt_status c_send(dopt_comm* c, const DLTensor* b, int32_t peer, int32_t tag,
                   dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->send(b, peer, tag), q); });
}
dopt_status c_recv(dopt_comm* c, DLTensor* b, int32_t peer, int32_t tag,
                   dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->recv(b, peer, tag), q); });
}
dopt_status c_barrier(dopt_comm* c, dopt_request** q) noexcept {
  return guarded([&] { return give(impl(c)->barrier(), q); });
}
dopt_status c_split(dopt_comm* c, int32_t color, int32_t key, dopt_comm** out) noexcept {
  return guarded([&] {
    if (!out) throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "split: NULL out"};
    *out = nullptr;
    TcpComm* sub = impl(c)->split(color, key);
    if (sub) *out = new dopt_comm{sub};
    return DOPT_OK;
  });
}

dopt_status c_test(dopt_request* r, int32_t* done) noexcept {
  return guarded([&] {
    if (!r || !done) throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "test: NULL request or done"};
    return r->req->test(done);
  });
}
dopt_status c_wait(dopt_request* r, int64_t timeout_ms) noexcept {
  return guarded([&] {
    if (!r) throw ApiError{DOPT_ERR_INVALID_ARGUMENT, "wait: NULL request"};
    return r->req->wait(timeout_ms);
  });
}
void c_request_free(dopt_request* r) noexcept { delete r; }

const dopt_communicator_v1 kVtable = {
    DOPT_COMMUNICATOR_V1_STRUCT_SIZE,
    nullptr,
    c_create,
    c_destroy,
    c_rank,
    c_world_size,
    c_allreduce,
    c_reduce_scatter,
    c_allgather,
    c_broadcast,
    c_send,
    c_recv,
    c_barrier,
    c_split,
    c_test,
    c_wait,
    c_request_free,
};

const dopt_component kComponents[] = {{
    DOPT_COMPONENT_V1_2_STRUCT_SIZE,
    nullptr,
    DOPT_KIND_COMMUNICATOR,
    "tcp",
    "1.0.0",
    "full-mesh TCP sockets, pipelined ring collectives (no server, no extra dependency)",
    kOptions,
    sizeof(kOptions) / sizeof(kOptions[0]),
    &kVtable,
    0,
    nullptr,
}};  // no traits; no check_job: every job its schema accepts

}  // namespace
}  // namespace distopt::plugins::tcp

extern "C" DOPT_EXPORT dopt_status dopt_plugin_init_v1(const dopt_host_api* host,
                                                       dopt_plugin_info* info) {
  using namespace distopt::plugins::tcp;
  if (!host || !info) return DOPT_ERR_INVALID_ARGUMENT;
  if (host->struct_size < DOPT_HOST_API_STRUCT_SIZE || host->abi_major != DOPT_ABI_VERSION_MAJOR) {
    if (host->struct_size >= DOPT_STRUCT_SIZE_UPTO(dopt_host_api, set_error) && host->set_error)
      host->set_error("tcp: the host's ABI is incompatible with this plugin (built for 1.x)");
    return DOPT_ERR_UNSUPPORTED;
  }
  if (info->struct_size < DOPT_PLUGIN_INFO_STRUCT_SIZE) {
    host->set_error("tcp: dopt_plugin_info is smaller than v1.0's");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  g_host = host;
  info->abi_major = DOPT_ABI_VERSION_MAJOR;
  info->abi_minor = DOPT_ABI_VERSION_MINOR;
  info->plugin_name = "tcp";
  info->plugin_version = "1.0.0";
  info->components = kComponents;
  info->num_components = 1;
  return DOPT_OK;
}
