// Asynchronous request helpers for plugin authors: the Request interface the
// generated glue maps dopt_request / dopt_reduce_request handles to, and a
// ready-made completion object a progress thread can finish. Torch-free.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "distopt/abi.h"
#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk {

/// One in-flight operation of a communicator or reducer. The glue owns it
/// (request_free deletes it); test/wait may be called from any thread.
class Request {
 public:
  virtual ~Request() = default;
  /// Non-blocking. true when the operation has completed successfully, false
  /// while it runs; throws sdk::Error when it failed (the glue then returns
  /// the error's status with *done = 1: a failed operation has completed).
  virtual bool test() = 0;
  /// Block until completion or timeout_ms (< 0: the component's own default
  /// timeout). true on success, false on timeout; throws sdk::Error on failure.
  /// On false the glue returns DOPT_ERR_TIMEOUT with the generic message
  /// "request timed out after N ms"; to word the timeout itself (e.g. name
  /// the operation), throw Error(DOPT_ERR_TIMEOUT, message) instead.
  virtual bool wait(int64_t timeout_ms) = 0;
  /// ABI 1.4: make `stream` (a cudaStream_t; nullptr: the legacy default
  /// stream) wait for the operation without blocking the host; throws
  /// sdk::Error when the operation has already failed. The default, right
  /// for host-memory work (a stream cannot wait on the host), blocks like
  /// wait(-1) and throws Error(DOPT_ERR_TIMEOUT) when that times out.
  virtual void stream_wait(void* /*stream*/) {
    if (!wait(-1)) throw Error(DOPT_ERR_TIMEOUT, "stream_wait: the operation did not complete");
  }
};

/// Shared completion state: the worker calls complete() once; any number of
/// waiters block on it. Keep it in a shared_ptr so the worker can finish an
/// operation whose request was already freed. Thread-safe.
class Completion {
 public:
  Completion() = default;
  /// `op` names the operation (e.g. "allreduce"): a CompletionRequest whose
  /// wait times out then fails with DOPT_ERR_TIMEOUT and the message
  /// "<op>: not complete after waiting N ms" (see CompletionRequest).
  explicit Completion(std::string op) : op_(std::move(op)) {}
  /// The operation's name given at construction ("" if none).
  const std::string& op() const noexcept { return op_; }

  /// Mark done with `status` (DOPT_OK or negative) and, on failure, a message.
  /// Later calls are ignored (the first outcome wins).
  void complete(dopt_status status = DOPT_OK, std::string message = "") {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (done_) return;
      done_ = true;
      status_ = status;
      message_ = std::move(message);
    }
    ready_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  bool done() const {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  /// As Request::test.
  bool test() const {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) rethrow_locked();
    return done_;
  }
  /// As Request::wait; timeout_ms < 0 waits forever.
  bool wait(int64_t timeout_ms) const {
    // Poll first, giving the core away between looks: a short operation
    // completes sooner than a sleeping waiter wakes (a futex wake-up costs
    // 5-60 us on a VM, a 4 KiB shared-memory allreduce 1-2 us).
    const auto poll_until =
        std::chrono::steady_clock::now() +
        std::chrono::microseconds(
            timeout_ms < 0 ? kPollMicros : std::min<int64_t>(kPollMicros, timeout_ms * 1000));
    while (!ready_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < poll_until)
      std::this_thread::yield();
    std::unique_lock<std::mutex> lk(mu_);
    if (timeout_ms < 0) {
      cv_.wait(lk, [&] { return done_; });
    } else if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return done_; })) {
      return false;
    }
    rethrow_locked();
    return true;
  }

 private:
  void rethrow_locked() const {
    if (status_ < 0)
      throw Error(status_, message_.empty() ? dopt_status_string(status_) : message_);
  }
  static constexpr int64_t kPollMicros = 200;
  const std::string op_;
  std::atomic<bool> ready_{false};  // done_, readable without the lock
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  dopt_status status_ = DOPT_OK;
  std::string message_;
};

/// A Request backed by a Completion. `default_timeout_ms` is used when wait
/// is called with a negative timeout (< 0 there too: wait forever). A wait
/// that times out returns false (the glue's generic timeout message), or, when
/// the Completion names its operation, throws Error(DOPT_ERR_TIMEOUT,
/// "<op>: not complete after waiting N ms").
class CompletionRequest : public Request {
 public:
  explicit CompletionRequest(std::shared_ptr<Completion> c, int64_t default_timeout_ms = -1)
      : c_(std::move(c)), default_timeout_ms_(default_timeout_ms) {}
  bool test() override { return c_->test(); }
  bool wait(int64_t timeout_ms) override {
    const int64_t t = timeout_ms < 0 ? default_timeout_ms_ : timeout_ms;
    if (c_->wait(t)) return true;
    if (c_->op().empty()) return false;
    throw Error(DOPT_ERR_TIMEOUT,
                c_->op() + ": not complete after waiting " + std::to_string(t) + " ms");
  }
  const std::shared_ptr<Completion>& completion() const { return c_; }

 private:
  std::shared_ptr<Completion> c_;
  int64_t default_timeout_ms_;
};

/// A request that is already complete (e.g. a no-op collective on one rank).
class DoneRequest : public Request {
 public:
  bool test() override { return true; }
  bool wait(int64_t) override { return true; }
};

}  // namespace distopt::sdk
