// ABI 1.3: the reducer configured in the `inner:` key of a reducer's YAML
// section, for reducers that wrap another one (declare
// DOPT_TRAIT_WRAPS_REDUCER). The host validates the inner at check time;
// the outer reducer creates it over a communicator of its choice and owns
// it (distopt/abi.h, dopt_host_api::inner_reducer / create_inner_reducer).
//
//   class MyReducer : public sdk::Reducer {
//    public:
//     static constexpr uint32_t traits = DOPT_TRAIT_EXACT_MEAN | DOPT_TRAIT_WRAPS_REDUCER;
//     MyReducer(const dopt_create_args& args, dopt_comm_ref comm,
//               const dopt_bucket* buckets, size_t n) {
//       if (sdk::inner_reducer_info(args.options)) {
//         dopt_create_args a = args;  // describe this rank in `sub`
//         ...
//         inner_ = sdk::InnerReducer(args.options, a, sub_.view(), buckets, n);
//       }
//     }
//     ... inner_.reduce(bucket).wait(); ...
//    private:
//     sdk::OwnedComm sub_;      // declared before inner_: destroyed after it
//     sdk::InnerReducer inner_;
//   };
//
// Torch-free, header-only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "distopt/abi.h"
#include "distopt/reducer.h"
#include "distopt/sdk/base/comm.hpp"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/reducer_view.hpp"
#include "distopt/sdk/base/state_io.hpp"

namespace distopt::sdk {

/// What the host says about a section's `inner:` reducer.
struct InnerReducerInfo {
  std::string name;     ///< its YAML name ("powersgd")
  uint32_t traits = 0;  ///< the DOPT_TRAIT_* it declares
  bool exact_mean() const { return (traits & DOPT_TRAIT_EXACT_MEAN) != 0; }
};

/// Whether the host implements ABI 1.3's inner reducers.
inline bool host_has_inner_reducers(const dopt_host_api* h = host()) noexcept {
  return h && h->struct_size >= DOPT_HOST_API_V1_3_STRUCT_SIZE && h->inner_reducer &&
         h->create_inner_reducer;
}

/// The `inner:` reducer of the section whose validated options are `outer`
/// (a constructor's args.options), or nullopt when there is none or the
/// host is older than ABI 1.3. Throws sdk::Error::reported when the host
/// refuses the query. Thread-safe.
inline std::optional<InnerReducerInfo> inner_reducer_info(const dopt_options* outer,
                                                          const dopt_host_api* h = host()) {
  if (!host_has_inner_reducers(h)) return std::nullopt;
  const char* name = nullptr;
  uint32_t traits = 0;
  check(h->inner_reducer(outer, &name, &traits), "inner_reducer");
  if (!name) return std::nullopt;
  return InnerReducerInfo{name, traits};
}

/// One instance of the `inner:` reducer, owned: the destructor destroys it
/// (so it must go before the communicator it was created over). Move-only;
/// empty when default-constructed. reduce / bytes_sent are as thread-safe as
/// the inner's (every reducer allows reduce and bytes_sent from any thread).
class InnerReducer {
 public:
  InnerReducer() = default;
  /// Create it (dopt_host_api::create_inner_reducer) over `comm` with the
  /// caller's `buckets`. `args` describes this rank in `comm` and has its
  /// own scope; its `options` are replaced by the inner's. Throws
  /// sdk::Error(UNSUPPORTED) on a host older than ABI 1.3,
  /// sdk::Error::reported with the inner's status and message when its
  /// create fails (DOPT_ERR_STATE: `outer` has no inner).
  InnerReducer(const dopt_options* outer, const dopt_create_args& args, CommView comm,
               const dopt_bucket* buckets, size_t num_buckets, const dopt_host_api* h = host()) {
    if (!host_has_inner_reducers(h))
      throw Error(DOPT_ERR_UNSUPPORTED,
                  "the host is older than ABI 1.3: it cannot create inner reducers");
    const dopt_comm_ref c = comm.ref();
    dopt_reducer_ref out{nullptr, nullptr};
    check(h->create_inner_reducer(outer, &args, &c, buckets, num_buckets, &out),
          "create_inner_reducer");
    ref_ = out;
  }
  InnerReducer(InnerReducer&& o) noexcept
      : ref_(std::exchange(o.ref_, dopt_reducer_ref{nullptr, nullptr})) {}
  InnerReducer& operator=(InnerReducer&& o) noexcept {
    if (this != &o) {
      reset();
      ref_ = std::exchange(o.ref_, dopt_reducer_ref{nullptr, nullptr});
    }
    return *this;
  }
  InnerReducer(const InnerReducer&) = delete;
  InnerReducer& operator=(const InnerReducer&) = delete;
  ~InnerReducer() { reset(); }

  explicit operator bool() const noexcept { return ref_.reducer != nullptr; }
  /// Start reducing `bucket` in place (its reduce; the result is the inner's
  /// average over the ranks of its communicator).
  ReduceHandle reduce(const dopt_bucket& bucket) { return ReducerView(ref_).reduce(bucket); }
  /// Bytes the inner put on the wire since creation (0 when empty).
  uint64_t bytes_sent() const { return ref_.reducer ? ref_.vt->bytes_sent(ref_.reducer) : 0; }
  /// Whether its vtable has save_state / load_state (ABI 1.1).
  bool has_state_io() const {
    return ref_.reducer && DOPT_HAS_FIELD(ref_.vt, dopt_reducer_v1, load_state) &&
           ref_.vt->save_state && ref_.vt->load_state;
  }
  /// Forward a checkpoint to the inner (its keys as it names them). Throws
  /// sdk::Error(UNSUPPORTED) when it has no save_state / load_state,
  /// sdk::Error::reported with its status otherwise.
  void save_state(const StateWriter& w) {
    require_state_io();
    check(ref_.vt->save_state(ref_.reducer, &w.c()), "inner save_state");
  }
  void load_state(const StateReader& r) {
    require_state_io();
    check(ref_.vt->load_state(ref_.reducer, &r.c()), "inner load_state");
  }
  /// Destroy the instance now (no-op when empty); its status is ignored.
  void reset() noexcept {
    if (ref_.reducer && ref_.vt) ref_.vt->destroy(ref_.reducer);
    ref_ = {nullptr, nullptr};
  }
  dopt_reducer_ref ref() const { return ref_; }

 private:
  void require_state_io() const {
    if (!has_state_io())
      throw Error(DOPT_ERR_UNSUPPORTED,
                  "the inner reducer has no save_state / load_state (ABI 1.0 plugin)");
  }
  dopt_reducer_ref ref_{nullptr, nullptr};
};

}  // namespace distopt::sdk
