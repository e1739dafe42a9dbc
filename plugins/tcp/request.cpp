// Request completion and waiting.
#include "request.hpp"

#include "host.hpp"

namespace distopt::plugins::tcp {

void Request::complete(dopt_status status, const std::string& msg) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;
    done_ = true;
    status_ = status;
    msg_ = msg;
  }
  cv_.notify_all();
}

bool Request::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

dopt_status Request::wait(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_ms < 0) {
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return done_; })) {
    lk.unlock();
    set_error(op_ + ": not complete after waiting " + std::to_string(timeout_ms) + " ms");
    return DOPT_ERR_TIMEOUT;
  }
  if (status_ < 0) set_error(msg_);
  return status_;
}

dopt_status Request::test(int32_t* done) {
  std::lock_guard<std::mutex> lk(mu_);
  *done = done_ ? 1 : 0;
  if (!done_) return DOPT_OK;
  if (status_ < 0) set_error(msg_);
  return status_;
}

}  // namespace distopt::plugins::tcp
