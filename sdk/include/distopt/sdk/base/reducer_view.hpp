// C++ view of the borrowed reducer an algorithm is handed (dopt_reducer_ref):
// ReducerView, and ReduceHandle, its RAII request whose failures throw
// sdk::Error::reported (the reducer already filled the host's error sink).
// Torch-free.
#pragma once

#include <cstdint>
#include <utility>

#include "distopt/reducer.h"
#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk {

/// Owns one dopt_reduce_request of a borrowed reducer. Move-only.
class ReduceHandle {
 public:
  ReduceHandle() = default;
  ReduceHandle(const dopt_reducer_v1* vt, dopt_reduce_request* req) : vt_(vt), req_(req) {}
  ReduceHandle(ReduceHandle&& o) noexcept : vt_(o.vt_), req_(std::exchange(o.req_, nullptr)) {}
  ReduceHandle& operator=(ReduceHandle&& o) noexcept {
    if (this != &o) {
      reset();
      vt_ = o.vt_;
      req_ = std::exchange(o.req_, nullptr);
    }
    return *this;
  }
  ~ReduceHandle() { reset(); }
  bool valid() const noexcept { return req_ != nullptr; }
  void wait(int64_t timeout_ms = -1) {
    if (!req_) return;
    check(vt_->wait(req_, timeout_ms), "reducer wait");
  }
  bool test() {
    if (!req_) return true;
    int32_t done = 0;
    check(vt_->test(req_, &done), "reducer test");
    return done != 0;
  }
  void reset() noexcept {
    if (req_ && vt_) vt_->request_free(req_);
    req_ = nullptr;
  }

 private:
  const dopt_reducer_v1* vt_ = nullptr;
  dopt_reduce_request* req_ = nullptr;
};

/// A borrowed reducer.
class ReducerView {
 public:
  ReducerView() = default;
  explicit ReducerView(dopt_reducer_ref ref) : ref_(ref) {}
  /// Start reducing `bucket` in place.
  ReduceHandle reduce(const dopt_bucket& bucket) {
    dopt_reduce_request* r = nullptr;
    check(ref_.vt->reduce(ref_.reducer, &bucket, &r), "reduce");
    return {ref_.vt, r};
  }
  uint64_t bytes_sent() const { return ref_.vt->bytes_sent(ref_.reducer); }
  dopt_reducer_ref ref() const { return ref_; }

 private:
  dopt_reducer_ref ref_{nullptr, nullptr};
};

}  // namespace distopt::sdk
