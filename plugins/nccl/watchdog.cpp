#include "watchdog.hpp"

#include <cstdio>
#include <cstdlib>

namespace distopt::plugins::nccl {

Watchdog::Watchdog(const Api& a, ncclComm_t comm, int device, const Settings& s, std::string name,
                   std::mutex& issue_mu)
    : a_(a), comm_(comm), device_(device), s_(s), name_(std::move(name)), issue_mu_(issue_mu) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Watchdog::track(std::shared_ptr<Op> op) {
  std::lock_guard<std::mutex> lk(mu_);
  ops_.push_back(std::move(op));
}

size_t Watchdog::pending() {
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ops = ops_;
  }
  size_t n = 0;
  for (const auto& op : ops) {
    try {
      if (!op->poll(a_)) ++n;
    } catch (const sdk::Error&) {
    }
  }
  return n;
}

std::string Watchdog::reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_;
}

void Watchdog::run() {
  a_.cudaSetDevice(device_);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(s_.watchdog_poll_ms), [&] { return stop_; });
    if (stop_ || aborted_) break;  // after an abort there is nothing left to watch
    lk.unlock();
    check();
    lk.lock();
  }
}

void Watchdog::check() {
  ncclResult_t state = ncclSuccess;
  if (a_.ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
      state != ncclInProgress) {
    abort(DOPT_ERR_COMM,
          "NCCL reported an asynchronous error on " + name_ + ": " + nccl_error(a_, state, comm_));
    return;
  }
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ops = ops_;
  }
  std::vector<std::shared_ptr<Op>> still;
  const auto now = Clock::now();
  std::shared_ptr<Op> late;
  for (const auto& op : ops) {
    bool done = true;
    try {
      done = op->poll(a_);
    } catch (const sdk::Error&) {  // failed: the request reports it
    }
    if (done) continue;
    still.push_back(op);
    if (!late && now > op->deadline()) late = op;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Keep ops tracked since the snapshot; drop the completed ones.
    std::vector<std::shared_ptr<Op>> next = std::move(still);
    for (size_t i = ops.size(); i < ops_.size(); ++i) next.push_back(ops_[i]);
    ops_ = std::move(next);
  }
  if (late)
    abort(DOPT_ERR_TIMEOUT, late->what() + " did not complete within timeout_s = " +
                                std::to_string(s_.timeout_s) + " s on " + name_);
}

void Watchdog::monitor_abort(const std::string& reason) {
  std::unique_lock<std::mutex> lk(mu_);
  const auto grace = std::chrono::milliseconds(static_cast<int64_t>(s_.abort_grace_s * 1000));
  if (cv_.wait_for(lk, grace, [&] { return abort_done_; })) return;
  std::fprintf(stderr,
               "distopt nccl: ncclCommAbort on %s did not return within abort_grace_s = %g s "
               "(it was aborting because: %s); ending the process with exit status %d, as "
               "PyTorch's NCCL heartbeat monitor does, so that the job does not hang\n",
               name_.c_str(), s_.abort_grace_s, reason.c_str(), kAbortHangExitStatus);
  std::fflush(stderr);
  std::_Exit(kAbortHangExitStatus);
}

void Watchdog::abort(dopt_status status, const std::string& reason) {
  if (aborted_.exchange(true)) {  // another thread aborts: wait for it
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return abort_done_; });
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    reason_ = reason;
  }
  std::thread monitor([this, reason] { monitor_abort(reason); });
  {
    std::lock_guard<std::mutex> issue(issue_mu_);  // no launch in flight
    a_.cudaSetDevice(device_);
    a_.ncclCommAbort(comm_);
  }
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard<std::mutex> lk(mu_);
    abort_done_ = true;
    ops.swap(ops_);
  }
  cv_.notify_all();
  monitor.join();
  for (const auto& op : ops)
    op->fail(status, reason.rfind(op->what(), 0) == 0
                         ? reason + "; the communicator was aborted (ncclCommAbort)"
                         : op->what() +
                               " failed: the communicator was aborted (ncclCommAbort) "
                               "because " +
                               reason);
}

}  // namespace distopt::plugins::nccl
