// Completion state of one asynchronous operation, shared between the caller's
// handle (dopt_request) and the thread that executes the operation.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "distopt/abi.h"

namespace distopt::plugins::tcp {

class Request {
 public:
  explicit Request(std::string op) : op_(std::move(op)) {}
  const std::string& op() const { return op_; }

  /// Mark complete (first call wins). `msg` is the error detail for status < 0.
  void complete(dopt_status status, const std::string& msg = "");
  bool done() const;
  /// Wait until done or timeout_ms (< 0: forever). Returns the status, or
  /// DOPT_ERR_TIMEOUT. On failure it reports the message through the host's
  /// error sink on the *calling* thread (set_error is thread-local).
  dopt_status wait(int64_t timeout_ms);
  /// Non-blocking: *done = 1 and the status when complete, else 0 and DOPT_OK.
  dopt_status test(int32_t* done);

 private:
  std::string op_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  dopt_status status_ = DOPT_OK;
  std::string msg_;
};

}  // namespace distopt::plugins::tcp

/// The opaque handle given to callers: a reference to the shared state, so a
/// request freed while running lets the operation finish and discards it.
struct dopt_request {
  std::shared_ptr<distopt::plugins::tcp::Request> req;
};
