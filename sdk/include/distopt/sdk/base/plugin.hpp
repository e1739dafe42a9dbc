// Writing a plugin in C++: derive from sdk::Communicator, sdk::Reducer or
// sdk::Algorithm, then list the classes in ONE DOPT_PLUGIN(...) at namespace
// scope of one .cpp. The macro generates the static vtables, the
// dopt_component table and the exported dopt_plugin_init_v1, which checks the
// host's ABI major and keeps the host pointer for sdk::host(). Every generated
// entry point is noexcept and maps exceptions to a status (sdk::guard).
//
//   struct MyReducer : distopt::sdk::Reducer {
//     MyReducer(const dopt_create_args& args, dopt_comm_ref comm,
//               const dopt_bucket* buckets, size_t num_buckets);
//     std::unique_ptr<distopt::sdk::Request> reduce(const dopt_bucket& b) override;
//     uint64_t bytes_sent() const override;
//   };
//   static constexpr dopt_option_spec kMyOptions[] = {
//       distopt::sdk::option_double("ratio", "0.01", "fraction sent").range_open_min(0, 1),
//   };
//   DOPT_PLUGIN("my", "1.0.0",
//               DOPT_COMPONENT(MyReducer, "my", "1.0.0", "what it does", kMyOptions))
//
// Constructors: a Communicator from (const dopt_create_args&); a Reducer from
// (const dopt_create_args&, dopt_comm_ref, const dopt_bucket*, size_t); an
// Algorithm from (const dopt_algorithm_args&). Throwing from a constructor
// fails create with the mapped status. Pass nullptr as the schema for a
// component without options (the option builder is in options.hpp).
//
// Optional static members of the class (ABI 1.2, see job_view.hpp):
//   static void check_job(const distopt::sdk::JobView& job);  // refuse a job at check time
//   static constexpr uint32_t traits = DOPT_TRAIT_EXACT_MEAN;   // properties it declares
// and (ABI 1.4, distopt/communicator.h "Device memory"):
//   static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCUDA);  // memory it accepts
// (absent: kDLCPU only; the host refuses tensors on other devices: a
// communicator's, and an optimizer whose parameters are on a device its
// reducer or algorithm does not declare).
// Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "distopt/abi.h"
#include "distopt/algorithm.h"
#include "distopt/communicator.h"
#include "distopt/job.h"
#include "distopt/reducer.h"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/job_view.hpp"
#include "distopt/sdk/base/options.hpp"
#include "distopt/sdk/base/request.hpp"
#include "distopt/sdk/base/state_io.hpp"

namespace distopt::sdk {

/// Base of communicator components; mirrors dopt_communicator_v1. Methods
/// may be called from several threads at once (the host's training thread
/// and the autograd thread). Optional collectives default to UNSUPPORTED.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;
  virtual std::unique_ptr<Request> allreduce(const DLTensor& send, DLTensor& recv,
                                             dopt_reduce_op op) = 0;
  virtual std::unique_ptr<Request> broadcast(DLTensor& buf, int32_t root) = 0;
  virtual std::unique_ptr<Request> barrier() = 0;
  virtual std::unique_ptr<Request> reduce_scatter(const DLTensor&, DLTensor&, dopt_reduce_op) {
    throw Error(DOPT_ERR_UNSUPPORTED, "reduce_scatter is not implemented by this communicator");
  }
  virtual std::unique_ptr<Request> allgather(const DLTensor&, DLTensor&) {
    throw Error(DOPT_ERR_UNSUPPORTED, "allgather is not implemented by this communicator");
  }
  virtual std::unique_ptr<Request> send(const DLTensor&, int32_t, int32_t) {
    throw Error(DOPT_ERR_UNSUPPORTED, "send is not implemented by this communicator");
  }
  virtual std::unique_ptr<Request> recv(DLTensor&, int32_t, int32_t) {
    throw Error(DOPT_ERR_UNSUPPORTED, "recv is not implemented by this communicator");
  }
  /// Collective; return nullptr for color < 0.
  virtual std::unique_ptr<Communicator> split(int32_t, int32_t) {
    throw Error(DOPT_ERR_UNSUPPORTED, "split is not implemented by this communicator");
  }
  /// ABI 1.4: the caller stream (a cudaStream_t; nullptr: the legacy default
  /// stream) that later device-memory operations are ordered after
  /// (distopt/communicator.h, "Device memory"). A communicator that declares
  /// kDLCUDA overrides it; the default refuses with UNSUPPORTED.
  virtual void set_stream(void* /*stream*/) {
    throw Error(DOPT_ERR_UNSUPPORTED,
                "set_stream: this communicator has no device streams (it accepts host memory "
                "only)");
  }
};

/// Base of reducer components; mirrors dopt_reducer_v1.
class Reducer {
 public:
  virtual ~Reducer() = default;
  /// Start reducing bucket.flat in place; the result must be the average over
  /// ranks (or the reducer's approximation of it).
  virtual std::unique_ptr<Request> reduce(const dopt_bucket& bucket) = 0;
  /// Bytes this rank put on the wire since creation.
  virtual uint64_t bytes_sent() const = 0;
  /// Checkpoints (ABI 1.1, distopt/state.h): put / restore everything needed
  /// to continue exactly (error-feedback residuals, warm-start matrices,
  /// counters). No communicator use. The defaults refuse with UNSUPPORTED so
  /// that a stateful reducer never saves silently incomplete checkpoints; a
  /// stateless one overrides them with empty bodies.
  virtual void save_state(StateWriter&) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this reducer cannot save checkpoints (no save_state)");
  }
  virtual void load_state(const StateReader&) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this reducer cannot load checkpoints (no load_state)");
  }
};

/// Base of algorithm components; mirrors dopt_algorithm_v1.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  /// Called once per bucket per step, in order, possibly from the autograd
  /// thread: start work and return.
  virtual void on_bucket_ready(const dopt_bucket& bucket) = 0;
  /// Finish the step (wait for bucket work, update, sync).
  virtual void step() = 0;
  virtual void set_lr(int32_t group, double lr) = 0;
  virtual uint64_t state_bytes() const = 0;
  /// Checkpoints (ABI 1.1, distopt/state.h): put this rank's optimizer state
  /// / restore the state of what this rank now owns (the checkpoint may come
  /// from another world size). No communicator use. Defaults refuse with
  /// UNSUPPORTED (see Reducer::save_state).
  virtual void save_state(StateWriter&) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this algorithm cannot save checkpoints (no save_state)");
  }
  virtual void load_state(const StateReader&) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this algorithm cannot load checkpoints (no load_state)");
  }
  /// Bytes the algorithm itself sent from this rank (not through the
  /// reducer) since creation; may be called from any thread.
  virtual uint64_t bytes_sent() const { return 0; }
  /// ABI 1.5 (algorithm.h set_grad_clip): clip the global L2 norm of the
  /// gradient the inner optimizer applies to `max_norm` (0 = off) from the
  /// next step on; implement with sdk::clip_grad_norm (sdk/optim/grad_clip.hpp).
  /// The default refuses with UNSUPPORTED, so the host refuses a job with
  /// optimizer.grad_clip > 0 naming this algorithm.
  virtual void set_grad_clip(double /*max_norm*/) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this algorithm does not clip gradients (no set_grad_clip)");
  }
  /// ABI 1.7 (algorithm.h, "Parameter sharding"): start / finish writing the
  /// full parameters of a sharded bucket into `full`. Called only when the
  /// class's static param_sharding(const OptionsView&) said so; the
  /// defaults refuse with UNSUPPORTED.
  virtual void gather_params(const dopt_bucket& /*bucket*/, DLTensor& /*full*/) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this algorithm does not shard parameters");
  }
  virtual void wait_params(const dopt_bucket& /*bucket*/) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this algorithm does not shard parameters");
  }
  virtual void scatter_params(const dopt_bucket& /*bucket*/, const DLTensor& /*full*/) {
    throw Error(DOPT_ERR_UNSUPPORTED, "this algorithm does not shard parameters");
  }
  /// ABI 1.9 (algorithm.h finish_buckets): before the host gives memory to
  /// a unit's gradient bucket. Return true after finishing every use of the
  /// sharded buckets handed so far this step (the host frees them); the
  /// default keeps reading them until the next on_bucket_ready.
  virtual bool finish_buckets() { return false; }
  // ABI 1.8 (algorithm.h discard_step): a class that can end a step without
  // an update declares `void discard_step()` (not virtual here: the vtable's
  // pointer is NULL for a class without it, which tells the host it cannot
  // shard parameters under mixed precision).
};

/// A component's option schema: a dopt_option_spec array, or nullptr for none.
struct SchemaRef {
  const dopt_option_spec* specs = nullptr;
  size_t count = 0;
  constexpr SchemaRef(std::nullptr_t) noexcept {}
  template <size_t N>
  constexpr SchemaRef(const dopt_option_spec (&a)[N]) noexcept : specs(a), count(N) {}
  constexpr SchemaRef(const dopt_option_spec* s, size_t n) noexcept : specs(s), count(n) {}
};

namespace detail {

template <class T>
T* self(void* h) {
  return reinterpret_cast<T*>(h);
}

inline dopt_status null_arg(const char* what) {
  set_error(std::string(what) + " is NULL");
  return DOPT_ERR_INVALID_ARGUMENT;
}

// Request handles of both kinds map to sdk::Request.
inline dopt_status request_test(Request* r, int32_t* done) {
  if (!r || !done) return null_arg("request or done");
  *done = 0;
  return guard([&] {
    try {
      *done = r->test() ? 1 : 0;
    } catch (...) {
      *done = 1;  // it failed, so it has completed (distopt/communicator.h)
      throw;
    }
  });
}
inline dopt_status request_wait(Request* r, int64_t timeout_ms) {
  if (!r) return null_arg("request");
  return guard([&]() -> dopt_status {
    if (r->wait(timeout_ms)) return DOPT_OK;
    set_error("request timed out after " + std::to_string(timeout_ms) + " ms");
    return DOPT_ERR_TIMEOUT;
  });
}

/// A reduce op from a C caller, read as its integer bits first: C may pass
/// any int, and loading a value outside 0..3 as the C++ enum is undefined
/// (the enum's range is that of a 2-bit field). Throws sdk::Error
/// (INVALID_ARGUMENT) "<op>: unknown reduce op N" for one outside SUM..MAX.
inline dopt_reduce_op abi_reduce_op(const dopt_reduce_op& op, const char* name) {
  std::underlying_type_t<dopt_reduce_op> raw;
  std::memcpy(&raw, &op, sizeof raw);
  const auto v = static_cast<std::make_signed_t<decltype(raw)>>(raw);  // -1 from C stays -1
  if (v < DOPT_REDUCE_SUM || v > DOPT_REDUCE_MAX)
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                std::string(name) + ": unknown reduce op " + std::to_string(v));
  return static_cast<dopt_reduce_op>(v);
}

template <class R>
dopt_status hand_out(std::unique_ptr<Request> req, R** out) {
  if (!req) throw Error(DOPT_ERR_INTERNAL, "component returned no request");
  *out = reinterpret_cast<R*>(req.release());
  return DOPT_OK;
}

template <class T>
struct CommGlue {
  static Communicator* c(dopt_comm* h) { return reinterpret_cast<Communicator*>(h); }
  static const Communicator* c(const dopt_comm* h) {
    return reinterpret_cast<const Communicator*>(h);
  }
  static dopt_comm* h(Communicator* c) { return reinterpret_cast<dopt_comm*>(c); }

  static dopt_status create(const dopt_create_args* args, dopt_comm** out) noexcept {
    if (!args || !out) return null_arg("args or out");
    *out = nullptr;
    return guard([&] { *out = h(static_cast<Communicator*>(new T(*args))); });
  }
  static dopt_status destroy(dopt_comm* comm) noexcept {
    return guard([&] { delete c(comm); });
  }
  static int32_t rank(const dopt_comm* comm) noexcept {
    if (!comm) return -1;
    try {
      return c(comm)->rank();
    } catch (...) {
      return -1;
    }
  }
  static int32_t world_size(const dopt_comm* comm) noexcept {
    if (!comm) return -1;
    try {
      return c(comm)->world_size();
    } catch (...) {
      return -1;
    }
  }
  static dopt_status allreduce(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                               dopt_reduce_op op, dopt_request** req) noexcept {
    if (!comm || !send || !recv || !req) return null_arg("comm, send, recv or req");
    *req = nullptr;
    return guard([&] {
      return hand_out(c(comm)->allreduce(*send, *recv, abi_reduce_op(op, "allreduce")), req);
    });
  }
  static dopt_status reduce_scatter(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                                    dopt_reduce_op op, dopt_request** req) noexcept {
    if (!comm || !send || !recv || !req) return null_arg("comm, send, recv or req");
    *req = nullptr;
    return guard([&] {
      return hand_out(c(comm)->reduce_scatter(*send, *recv, abi_reduce_op(op, "reduce_scatter")),
                      req);
    });
  }
  static dopt_status allgather(dopt_comm* comm, const DLTensor* send, DLTensor* recv,
                               dopt_request** req) noexcept {
    if (!comm || !send || !recv || !req) return null_arg("comm, send, recv or req");
    *req = nullptr;
    return guard([&] { return hand_out(c(comm)->allgather(*send, *recv), req); });
  }
  static dopt_status broadcast(dopt_comm* comm, DLTensor* buf, int32_t root,
                               dopt_request** req) noexcept {
    if (!comm || !buf || !req) return null_arg("comm, buf or req");
    *req = nullptr;
    return guard([&] { return hand_out(c(comm)->broadcast(*buf, root), req); });
  }
  static dopt_status send(dopt_comm* comm, const DLTensor* buf, int32_t peer, int32_t tag,
                          dopt_request** req) noexcept {
    if (!comm || !buf || !req) return null_arg("comm, buf or req");
    *req = nullptr;
    return guard([&] { return hand_out(c(comm)->send(*buf, peer, tag), req); });
  }
  static dopt_status recv(dopt_comm* comm, DLTensor* buf, int32_t peer, int32_t tag,
                          dopt_request** req) noexcept {
    if (!comm || !buf || !req) return null_arg("comm, buf or req");
    *req = nullptr;
    return guard([&] { return hand_out(c(comm)->recv(*buf, peer, tag), req); });
  }
  static dopt_status barrier(dopt_comm* comm, dopt_request** req) noexcept {
    if (!comm || !req) return null_arg("comm or req");
    *req = nullptr;
    return guard([&] { return hand_out(c(comm)->barrier(), req); });
  }
  static dopt_status split(dopt_comm* comm, int32_t color, int32_t key, dopt_comm** out) noexcept {
    if (!comm || !out) return null_arg("comm or out");
    *out = nullptr;
    return guard([&] { *out = h(c(comm)->split(color, key).release()); });
  }
  static dopt_status test(dopt_request* r, int32_t* done) noexcept {
    return request_test(reinterpret_cast<Request*>(r), done);
  }
  static dopt_status wait(dopt_request* r, int64_t timeout_ms) noexcept {
    return request_wait(reinterpret_cast<Request*>(r), timeout_ms);
  }
  static void request_free(dopt_request* r) noexcept {
    try {
      delete reinterpret_cast<Request*>(r);
    } catch (...) {
    }
  }
  static dopt_status set_stream(dopt_comm* comm, void* stream) noexcept {
    if (!comm) return null_arg("comm");
    return guard([&] { c(comm)->set_stream(stream); });
  }
  static dopt_status stream_wait(dopt_request* r, void* stream) noexcept {
    if (!r) return null_arg("request");
    return guard([&] { reinterpret_cast<Request*>(r)->stream_wait(stream); });
  }

  static constexpr dopt_communicator_v1 vtable = {DOPT_COMMUNICATOR_V1_4_STRUCT_SIZE,
                                                  nullptr,
                                                  &create,
                                                  &destroy,
                                                  &rank,
                                                  &world_size,
                                                  &allreduce,
                                                  &reduce_scatter,
                                                  &allgather,
                                                  &broadcast,
                                                  &send,
                                                  &recv,
                                                  &barrier,
                                                  &split,
                                                  &test,
                                                  &wait,
                                                  &request_free,
                                                  &set_stream,
                                                  &stream_wait};
};

template <class T>
struct ReducerGlue {
  static Reducer* r(dopt_reducer* h) { return reinterpret_cast<Reducer*>(h); }
  static const Reducer* r(const dopt_reducer* h) { return reinterpret_cast<const Reducer*>(h); }

  static dopt_status create(const dopt_create_args* args, dopt_comm_ref comm,
                            const dopt_bucket* buckets, size_t num_buckets,
                            dopt_reducer** out) noexcept {
    if (!args || !out || (!buckets && num_buckets)) return null_arg("args, out or buckets");
    *out = nullptr;
    return guard([&] {
      *out = reinterpret_cast<dopt_reducer*>(
          static_cast<Reducer*>(new T(*args, comm, buckets, num_buckets)));
    });
  }
  static dopt_status destroy(dopt_reducer* h) noexcept {
    return guard([&] { delete r(h); });
  }
  static dopt_status reduce(dopt_reducer* h, const dopt_bucket* bucket,
                            dopt_reduce_request** req) noexcept {
    if (!h || !bucket || !req) return null_arg("reducer, bucket or req");
    *req = nullptr;
    return guard([&] { return hand_out(r(h)->reduce(*bucket), req); });
  }
  static dopt_status test(dopt_reduce_request* q, int32_t* done) noexcept {
    return request_test(reinterpret_cast<Request*>(q), done);
  }
  static dopt_status wait(dopt_reduce_request* q, int64_t timeout_ms) noexcept {
    return request_wait(reinterpret_cast<Request*>(q), timeout_ms);
  }
  static void request_free(dopt_reduce_request* q) noexcept {
    try {
      delete reinterpret_cast<Request*>(q);
    } catch (...) {
    }
  }
  static uint64_t bytes_sent(const dopt_reducer* h) noexcept {
    try {
      return r(h)->bytes_sent();
    } catch (...) {
      return 0;
    }
  }
  static dopt_status save_state(dopt_reducer* h, const dopt_state_writer* w) noexcept {
    if (!h || !w) return null_arg("reducer or writer");
    return guard([&] {
      StateWriter sw(*w);
      r(h)->save_state(sw);
    });
  }
  static dopt_status load_state(dopt_reducer* h, const dopt_state_reader* rd) noexcept {
    if (!h || !rd) return null_arg("reducer or reader");
    return guard([&] { r(h)->load_state(StateReader(*rd)); });
  }

  static constexpr dopt_reducer_v1 vtable = {DOPT_REDUCER_V1_1_STRUCT_SIZE,
                                             nullptr,
                                             &create,
                                             &destroy,
                                             &reduce,
                                             &test,
                                             &wait,
                                             &request_free,
                                             &bytes_sent,
                                             &save_state,
                                             &load_state};
};

template <class T>
struct AlgorithmGlue {
  static Algorithm* a(dopt_algorithm* h) { return reinterpret_cast<Algorithm*>(h); }
  static const Algorithm* a(const dopt_algorithm* h) {
    return reinterpret_cast<const Algorithm*>(h);
  }

  static dopt_status create(const dopt_algorithm_args* args, dopt_algorithm** out) noexcept {
    if (!args || !out) return null_arg("args or out");
    *out = nullptr;
    return guard(
        [&] { *out = reinterpret_cast<dopt_algorithm*>(static_cast<Algorithm*>(new T(*args))); });
  }
  static dopt_status destroy(dopt_algorithm* h) noexcept {
    return guard([&] { delete a(h); });
  }
  static dopt_status on_bucket_ready(dopt_algorithm* h, const dopt_bucket* b) noexcept {
    if (!h || !b) return null_arg("algorithm or bucket");
    return guard([&] { a(h)->on_bucket_ready(*b); });
  }
  static dopt_status step(dopt_algorithm* h) noexcept {
    if (!h) return null_arg("algorithm");
    return guard([&] { a(h)->step(); });
  }
  static dopt_status set_lr(dopt_algorithm* h, int32_t group, double lr) noexcept {
    if (!h) return null_arg("algorithm");
    return guard([&] { a(h)->set_lr(group, lr); });
  }
  static uint64_t state_bytes(const dopt_algorithm* h) noexcept {
    try {
      return a(h)->state_bytes();
    } catch (...) {
      return 0;
    }
  }
  static dopt_status save_state(dopt_algorithm* h, const dopt_state_writer* w) noexcept {
    if (!h || !w) return null_arg("algorithm or writer");
    return guard([&] {
      StateWriter sw(*w);
      a(h)->save_state(sw);
    });
  }
  static dopt_status load_state(dopt_algorithm* h, const dopt_state_reader* rd) noexcept {
    if (!h || !rd) return null_arg("algorithm or reader");
    return guard([&] { a(h)->load_state(StateReader(*rd)); });
  }
  static uint64_t bytes_sent(const dopt_algorithm* h) noexcept {
    try {
      return a(h)->bytes_sent();
    } catch (...) {
      return 0;
    }
  }

  static dopt_status set_grad_clip(dopt_algorithm* h, double max_norm) noexcept {
    if (!h) return null_arg("algorithm");
    return guard([&] { a(h)->set_grad_clip(max_norm); });
  }

  // ABI 1.7: the class's optional static param_sharding(const OptionsView&)
  // (absent: it never shards parameters).
  template <class U, class = void>
  struct HasParamSharding : std::false_type {};
  template <class U>
  struct HasParamSharding<
      U, std::void_t<decltype(U::param_sharding(std::declval<const OptionsView&>()))>>
      : std::true_type {};
  static int32_t param_sharding(const dopt_options* options) noexcept {
    if constexpr (HasParamSharding<T>::value) {
      if (!options) return DOPT_PARAM_SHARDING_NONE;
      try {
        return static_cast<int32_t>(T::param_sharding(OptionsView(options)));
      } catch (...) {
        return DOPT_PARAM_SHARDING_NONE;
      }
    } else {
      (void)options;
      return DOPT_PARAM_SHARDING_NONE;
    }
  }
  static dopt_status gather_params(dopt_algorithm* h, const dopt_bucket* b,
                                   DLTensor* full) noexcept {
    if (!h || !b || !full) return null_arg("algorithm, bucket or full");
    return guard([&] { a(h)->gather_params(*b, *full); });
  }
  static dopt_status wait_params(dopt_algorithm* h, const dopt_bucket* b) noexcept {
    if (!h || !b) return null_arg("algorithm or bucket");
    return guard([&] { a(h)->wait_params(*b); });
  }
  static dopt_status scatter_params(dopt_algorithm* h, const dopt_bucket* b,
                                    const DLTensor* full) noexcept {
    if (!h || !b || !full) return null_arg("algorithm, bucket or full");
    return guard([&] { a(h)->scatter_params(*b, *full); });
  }

  // ABI 1.8: the class's optional discard_step() (absent: NULL in the vtable).
  template <class U, class = void>
  struct HasDiscardStep : std::false_type {};
  template <class U>
  struct HasDiscardStep<U, std::void_t<decltype(std::declval<U&>().discard_step())>>
      : std::true_type {};
  static dopt_status discard_step(dopt_algorithm* h) noexcept {
    if (!h) return null_arg("algorithm");
    if constexpr (HasDiscardStep<T>::value) {
      return guard([&] { static_cast<T*>(a(h))->discard_step(); });
    } else {
      return DOPT_ERR_UNSUPPORTED;  // not reached: the vtable holds NULL
    }
  }

  static dopt_status finish_buckets(dopt_algorithm* h, int32_t* finished) noexcept {
    if (!h || !finished) return null_arg("algorithm or finished");
    *finished = 0;
    return guard([&] { *finished = a(h)->finish_buckets() ? 1 : 0; });
  }

  static constexpr dopt_algorithm_v1 vtable = {DOPT_ALGORITHM_V1_9_STRUCT_SIZE,
                                               nullptr,
                                               &create,
                                               &destroy,
                                               &on_bucket_ready,
                                               &step,
                                               &set_lr,
                                               &state_bytes,
                                               &save_state,
                                               &load_state,
                                               &bytes_sent,
                                               &set_grad_clip,
                                               &param_sharding,
                                               &gather_params,
                                               &wait_params,
                                               &scatter_params,
                                               HasDiscardStep<T>::value ? &discard_step : nullptr,
                                               &finish_buckets};
};

// ABI 1.2: the component class's optional static check_job and traits.
template <class T, class = void>
struct HasCheckJob : std::false_type {};
template <class T>
struct HasCheckJob<T, std::void_t<decltype(T::check_job(std::declval<const JobView&>()))>>
    : std::true_type {};

template <class T, class = void>
struct TraitsOf : std::integral_constant<uint32_t, 0> {};
template <class T>
struct TraitsOf<T, std::void_t<decltype(T::traits)>>
    : std::integral_constant<uint32_t, static_cast<uint32_t>(T::traits)> {};

// ABI 1.4: the component class's optional static devices (0: kDLCPU only).
template <class T, class = void>
struct DevicesOf : std::integral_constant<uint32_t, 0> {};
template <class T>
struct DevicesOf<T, std::void_t<decltype(T::devices)>>
    : std::integral_constant<uint32_t, static_cast<uint32_t>(T::devices)> {};

template <class T>
dopt_status check_job(const dopt_job* job) noexcept {
  if (!job || job->struct_size < DOPT_JOB_STRUCT_SIZE || !job->reject)
    return null_arg("job (or a job view older than ABI 1.2's)");
  return guard([&] {
    try {
      T::check_job(JobView(*job));
    } catch (const JobRejected& e) {
      job->reject(job, e.key().c_str(), e.what());
      throw;  // the barrier returns its status
    }
  });
}

template <class T>
constexpr dopt_status (*check_job_of() noexcept)(const dopt_job*) {
  if constexpr (HasCheckJob<T>::value)
    return &check_job<T>;
  else
    return nullptr;
}

inline dopt_status plugin_init(const dopt_host_api* h, dopt_plugin_info* info,
                               const char* plugin_name, const char* plugin_version,
                               const dopt_component* components, size_t n) noexcept {
  if (!h || !info) return DOPT_ERR_INVALID_ARGUMENT;
  if (h->struct_size < DOPT_STRUCT_SIZE_UPTO(dopt_host_api, abi_minor))
    return DOPT_ERR_INVALID_ARGUMENT;
  if (h->abi_major != DOPT_ABI_VERSION_MAJOR) {
    // set_error's position is fixed within major 1 only; a host of another
    // major gets the status without a message.
    return DOPT_ERR_UNSUPPORTED;
  }
  if (h->struct_size < DOPT_HOST_API_STRUCT_SIZE) {
    if (h->set_error && DOPT_HAS_FIELD(h, dopt_host_api, set_error))
      h->set_error(
          (std::string("plugin '") + plugin_name + "': host API table is smaller than ABI 1.0's")
              .c_str());
    return DOPT_ERR_UNSUPPORTED;
  }
  if (info->struct_size < DOPT_STRUCT_SIZE_UPTO(dopt_plugin_info, num_components)) {
    h->set_error(
        (std::string("plugin '") + plugin_name + "': dopt_plugin_info is smaller than ABI 1.0's")
            .c_str());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
  set_host(h);
  info->abi_major = DOPT_ABI_VERSION_MAJOR;
  info->abi_minor = DOPT_ABI_VERSION_MINOR;
  info->plugin_name = plugin_name;
  info->plugin_version = plugin_version;
  info->components = components;
  info->num_components = n;
  return DOPT_OK;
}

}  // namespace detail

/// The dopt_component describing class T (kind deduced from its base class).
template <class T>
constexpr dopt_component component(const char* name, const char* version, const char* description,
                                   SchemaRef schema) noexcept {
  static_assert(std::is_base_of_v<Communicator, T> + std::is_base_of_v<Reducer, T> +
                        std::is_base_of_v<Algorithm, T> ==
                    1,
                "a component class derives from exactly one of sdk::Communicator, sdk::Reducer, "
                "sdk::Algorithm");
  if constexpr (std::is_base_of_v<Communicator, T>) {
    return {DOPT_COMPONENT_V1_4_STRUCT_SIZE,
            nullptr,
            DOPT_KIND_COMMUNICATOR,
            name,
            version,
            description,
            schema.specs,
            schema.count,
            &detail::CommGlue<T>::vtable,
            detail::TraitsOf<T>::value,
            detail::check_job_of<T>(),
            detail::DevicesOf<T>::value};
  } else if constexpr (std::is_base_of_v<Reducer, T>) {
    return {DOPT_COMPONENT_V1_4_STRUCT_SIZE,
            nullptr,
            DOPT_KIND_REDUCER,
            name,
            version,
            description,
            schema.specs,
            schema.count,
            &detail::ReducerGlue<T>::vtable,
            detail::TraitsOf<T>::value,
            detail::check_job_of<T>(),
            detail::DevicesOf<T>::value};
  } else {
    return {DOPT_COMPONENT_V1_4_STRUCT_SIZE,
            nullptr,
            DOPT_KIND_ALGORITHM,
            name,
            version,
            description,
            schema.specs,
            schema.count,
            &detail::AlgorithmGlue<T>::vtable,
            detail::TraitsOf<T>::value,
            detail::check_job_of<T>(),
            detail::DevicesOf<T>::value};
  }
}

}  // namespace distopt::sdk

/// One component of a plugin: its class, YAML name, version, one-line
/// description and option schema (a dopt_option_spec array, or nullptr).
#define DOPT_COMPONENT(CLASS, NAME, VERSION, DESCRIPTION, SCHEMA) \
  ::distopt::sdk::component<CLASS>(NAME, VERSION, DESCRIPTION, ::distopt::sdk::SchemaRef(SCHEMA))

/// Define the plugin's exported entry dopt_plugin_init_v1 with its components
/// (one or more DOPT_COMPONENT(...)). Use once per plugin, at namespace scope.
#define DOPT_PLUGIN(PLUGIN_NAME, PLUGIN_VERSION, ...)                                       \
  extern "C" DOPT_EXPORT dopt_status dopt_plugin_init_v1(const dopt_host_api* host,         \
                                                         dopt_plugin_info* info) noexcept { \
    static const dopt_component dopt_components_[] = {__VA_ARGS__};                         \
    return ::distopt::sdk::detail::plugin_init(                                             \
        host, info, PLUGIN_NAME, PLUGIN_VERSION, dopt_components_,                          \
        sizeof(dopt_components_) / sizeof(dopt_components_[0]));                            \
  }
