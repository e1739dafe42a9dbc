// The `nccl` communicator's watchdog (PyTorch's ProcessGroupNCCL watchdog and
// heartbeat monitor, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 semantics):
//  - a thread polls, every watchdog_poll_ms, ncclCommGetAsyncError and the
//    completion event and deadline (launch + timeout_s) of every pending
//    operation;
//  - on an asynchronous NCCL error or a passed deadline it aborts the
//    communicator (ncclCommAbort) and then fails every pending operation
//    with a message naming it (and, for the one that timed out, the
//    timeout); later operations are refused;
//  - ncclCommAbort itself can hang (NCCL issues 992, 863, 1777): a monitor
//    thread gives it abort_grace_s, then writes the reason to stderr and
//    ends the process with exit status 134 (as the SIGABRT PyTorch's
//    heartbeat monitor raises would) — a hung rank must not hang the job.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api.hpp"
#include "op.hpp"
#include "settings.hpp"

namespace distopt::plugins::nccl {

/// Exit status of a process whose ncclCommAbort did not return in time.
constexpr int kAbortHangExitStatus = 134;

class Watchdog {
 public:
  /// `issue_mu` is the communicator's launch mutex: abort takes it (after
  /// raising aborted()) so that no launch runs on a freed communicator.
  /// `name` names the communicator in messages ("nccl rank 1 of 4").
  Watchdog(const Api& a, ncclComm_t comm, int device, const Settings& s, std::string name,
           std::mutex& issue_mu);
  ~Watchdog();  ///< stops the thread (does not abort)
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Watch a launched operation until it completes or fails.
  void track(std::shared_ptr<Op> op);
  /// Number of tracked operations not yet seen complete.
  size_t pending();
  /// Abort the communicator once (a concurrent second call waits for the
  /// first), then fail every tracked operation with `status` and
  /// "<op>: <reason>". Ends the process if ncclCommAbort hangs (above).
  void abort(dopt_status status, const std::string& reason);
  /// Raised as soon as an abort starts; launches check it.
  const std::atomic<bool>& aborted() const { return aborted_; }
  /// Why it aborted ("" before).
  std::string reason() const;
  /// Stop the polling thread (idempotent); abort still works afterwards.
  void stop();

 private:
  void run();
  void check();
  void monitor_abort(const std::string& reason);

  const Api& a_;
  ncclComm_t comm_;
  int device_;
  Settings s_;
  std::string name_;
  std::mutex& issue_mu_;

  mutable std::mutex mu_;  // ops_, reason_, stop_, abort_done_
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Op>> ops_;
  std::string reason_;
  bool stop_ = false;
  bool abort_done_ = false;
  std::atomic<bool> aborted_{false};
  std::thread thread_;
};

}  // namespace distopt::plugins::nccl
