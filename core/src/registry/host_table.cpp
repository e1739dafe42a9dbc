// The host side of the plugin ABI: the dopt_host_api table every plugin gets
// at load (registry.cpp), over the host's services (base/services.hpp) and
// the store and options it hands plugins.
#include <algorithm>
#include <cstring>
#include <string>

#include "base/services.hpp"
#include "distopt/component_options.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/reducer.h"
#include "distopt/registry.hpp"
#include "distopt/store.hpp"

namespace distopt {
namespace {

Store* as_store(dopt_store* s) { return reinterpret_cast<Store*>(s); }

// ---- the C functions of the table; none lets an exception escape ----------

void c_log(int32_t level, const char* who, const char* msg) noexcept {
  try {
    log(level, who ? who : "?", msg ? msg : "");
  } catch (...) {
  }
}

void c_set_error(const char* msg) noexcept {
  try {
    set_last_error(msg ? msg : "");
  } catch (...) {
  }
}

template <typename F>
dopt_status option_get(const dopt_options* opts, const char* name, F&& f) noexcept {
  if (!opts || !name) {
    c_set_error("option getter: NULL options or name");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  try {
    f(*Options::from_c(opts), std::string(name));
    return DOPT_OK;
  } catch (const std::exception& e) {
    c_set_error(e.what());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
}

dopt_status c_option_bool(const dopt_options* o, const char* n, int32_t* out) noexcept {
  if (!out) return DOPT_ERR_INVALID_ARGUMENT;
  return option_get(
      o, n, [&](const Options& opts, const std::string& k) { *out = opts.get_bool(k) ? 1 : 0; });
}
dopt_status c_option_int(const dopt_options* o, const char* n, int64_t* out) noexcept {
  if (!out) return DOPT_ERR_INVALID_ARGUMENT;
  return option_get(o, n,
                    [&](const Options& opts, const std::string& k) { *out = opts.get_int(k); });
}
dopt_status c_option_double(const dopt_options* o, const char* n, double* out) noexcept {
  if (!out) return DOPT_ERR_INVALID_ARGUMENT;
  return option_get(o, n,
                    [&](const Options& opts, const std::string& k) { *out = opts.get_double(k); });
}
dopt_status c_option_string(const dopt_options* o, const char* n, const char** out) noexcept {
  if (!out) return DOPT_ERR_INVALID_ARGUMENT;
  return option_get(
      o, n, [&](const Options& opts, const std::string& k) { *out = opts.get_string(k).c_str(); });
}

dopt_status c_store_set(dopt_store* s, const char* key, const void* value, size_t len) noexcept {
  if (!s || !key || (!value && len)) {
    c_set_error("store_set: NULL store, key or value");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  try {
    const auto* p = static_cast<const uint8_t*>(value);
    as_store(s)->set(key, std::vector<uint8_t>(p, p + len));
    return DOPT_OK;
  } catch (const std::exception& e) {
    c_set_error(e.what());
    return DOPT_ERR_COMM;
  }
}

dopt_status c_store_get(dopt_store* s, const char* key, void* buf, size_t cap, size_t* len,
                        int64_t timeout_ms) noexcept {
  if (!s || !key || (!buf && cap)) {
    c_set_error("store_get: NULL store, key or buffer");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  try {
    Store* st = as_store(s);
    auto timeout = timeout_ms < 0 ? st->timeout() : std::chrono::milliseconds(timeout_ms);
    std::vector<uint8_t> v;
    try {
      v = st->get(key, timeout);
    } catch (const RendezvousError& e) {
      c_set_error(e.what());
      // A missing key is a timeout; anything else (server gone) is a comm error.
      return st->check(key) ? DOPT_ERR_COMM : DOPT_ERR_TIMEOUT;
    }
    if (len) *len = v.size();
    // An empty value has no data(): memcpy from NULL is undefined even for 0 bytes.
    if (cap && !v.empty()) std::memcpy(buf, v.data(), std::min(cap, v.size()));
    return DOPT_OK;
  } catch (const std::exception& e) {
    c_set_error(e.what());
    return DOPT_ERR_COMM;
  }
}

dopt_status c_store_add(dopt_store* s, const char* key, int64_t delta, int64_t* out) noexcept {
  if (!s || !key) {
    c_set_error("store_add: NULL store or key");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  try {
    int64_t v = as_store(s)->add(key, delta);
    if (out) *out = v;
    return DOPT_OK;
  } catch (const std::exception& e) {
    c_set_error(e.what());
    return DOPT_ERR_COMM;
  }
}

void c_metric_add(const char* name, double value) noexcept {
  if (!name) return;
  try {
    metric_add(name, value);
  } catch (...) {
  }
}

// ---- ABI 1.3: inner reducers (the outer's validated Options carry them) ----

dopt_status c_inner_reducer(const dopt_options* outer, const char** name,
                            uint32_t* traits) noexcept {
  if (name) *name = nullptr;
  if (traits) *traits = 0;
  if (!outer) {
    c_set_error("inner_reducer: NULL options");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  const InnerComponent* in = Options::from_c(outer)->inner();
  if (!in) return DOPT_OK;
  if (name) *name = in->info.name.c_str();
  if (traits) *traits = in->info.traits;
  return DOPT_OK;
}

dopt_status c_create_inner_reducer(const dopt_options* outer, const dopt_create_args* args,
                                   const dopt_comm_ref* comm, const dopt_bucket* buckets,
                                   size_t num_buckets, dopt_reducer_ref* out) noexcept {
  if (!outer || !args || !comm || !out || (!buckets && num_buckets)) {
    c_set_error("create_inner_reducer: NULL options, args, comm, out or buckets");
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  *out = {nullptr, nullptr};
  const InnerComponent* in = Options::from_c(outer)->inner();
  if (!in) {
    c_set_error("create_inner_reducer: this reducer's section has no `inner:` reducer");
    return DOPT_ERR_STATE;
  }
  try {
    dopt_create_args a{};
    const size_t n = std::min(args->struct_size, sizeof a);
    std::memcpy(&a, args, n);  // a caller of another minor: the fields it has
    a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    a.options = in->options.c_handle();
    const auto* vt = static_cast<const dopt_reducer_v1*>(in->info.vtable);
    dopt_reducer* r = nullptr;
    const dopt_status st = vt->create(&a, *comm, buckets, num_buckets, &r);
    if (st < 0) return st;  // its message is in the error sink
    if (!r) {
      c_set_error(
          ("create_inner_reducer: reducer '" + in->info.name + "' created no instance").c_str());
      return DOPT_ERR_INTERNAL;
    }
    *out = {vt, r};
    return DOPT_OK;
  } catch (const std::exception& e) {
    c_set_error(e.what());
    return DOPT_ERR_INTERNAL;
  }
}

dopt_host_api make_table() {
  dopt_host_api t{};
  t.struct_size = sizeof(dopt_host_api);
  t.ext = nullptr;
  t.abi_major = DOPT_ABI_VERSION_MAJOR;
  t.abi_minor = DOPT_ABI_VERSION_MINOR;
  t.log = c_log;
  t.set_error = c_set_error;
  t.option_bool = c_option_bool;
  t.option_int = c_option_int;
  t.option_double = c_option_double;
  t.option_string = c_option_string;
  t.store_set = c_store_set;
  t.store_get = c_store_get;
  t.store_add = c_store_add;
  t.metric_add = c_metric_add;
  t.inner_reducer = c_inner_reducer;
  t.create_inner_reducer = c_create_inner_reducer;
  return t;
}

}  // namespace

const dopt_host_api* host_api() {
  static const dopt_host_api table = make_table();
  return &table;
}

}  // namespace distopt
