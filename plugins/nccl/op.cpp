#include "op.hpp"

#include <algorithm>
#include <thread>

namespace distopt::plugins::nccl {

Event::Event(const Api& a, int device) : a_(a) {
  a_.cudaSetDevice(device);
  cudaError_t e = a_.cudaEventCreateWithFlags(&e_, cudaEventDisableTiming);
  if (e != cudaSuccess)
    throw sdk::Error(DOPT_ERR_COMM, "cudaEventCreateWithFlags failed: " + cuda_error(a_, e));
}

Event::~Event() {
  if (e_) a_.cudaEventDestroy(e_);
}

void Op::launched(std::shared_ptr<Event> done, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lk(mu_);
  done_ = std::move(done);
  deadline_ = deadline;
}

std::shared_ptr<Event> Op::event() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

bool Op::is_launched() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_ != nullptr;
}

Clock::time_point Op::deadline() const {
  std::lock_guard<std::mutex> lk(mu_);
  return deadline_;
}

void Op::fail(dopt_status status, const std::string& message) {
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_ || status_ < 0) return;
  status_ = status;
  message_ = message;
}

bool Op::poll(const Api& a) {
  std::shared_ptr<Event> ev;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_ < 0) throw sdk::Error(status_, message_);
    if (finished_) return true;
    if (!done_) return false;
    ev = done_;
  }
  cudaError_t e = a.cudaEventQuery(ev->get());
  if (e == cudaErrorNotReady) return false;
  std::lock_guard<std::mutex> lk(mu_);
  if (status_ < 0) throw sdk::Error(status_, message_);  // failed meanwhile
  if (e != cudaSuccess) {
    status_ = DOPT_ERR_COMM;
    message_ = what_ + ": cudaEventQuery failed: " + cuda_error(a, e);
    throw sdk::Error(status_, message_);
  }
  finished_ = true;
  return true;
}

OpRequest::OpRequest(const Api& a, std::shared_ptr<Op> op, int device, std::function<void()> flush)
    : a_(a), op_(std::move(op)), device_(device), flush_(std::move(flush)) {}

void OpRequest::ensure_launched() {
  if (flush_ && !op_->is_launched()) flush_();
}

bool OpRequest::test() {
  ensure_launched();
  a_.cudaSetDevice(device_);
  return op_->poll(a_);
}

bool OpRequest::wait(int64_t timeout_ms) {
  ensure_launched();
  a_.cudaSetDevice(device_);
  // timeout_ms < 0: until completion or failure. The watchdog fails the op
  // at its deadline (timeout_s) or ends the process, so this ends too.
  const auto end = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  for (int round = 0;; ++round) {
    if (op_->poll(a_)) return true;
    if (timeout_ms >= 0 && Clock::now() >= end) return false;  // the op goes on
    if (round < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(round < 1000 ? 50 : 500));
  }
}

void OpRequest::stream_wait(void* stream) {
  ensure_launched();
  a_.cudaSetDevice(device_);
  if (op_->poll(a_)) return;  // already complete (throws when it failed)
  std::shared_ptr<Event> ev = op_->event();
  if (!ev) throw sdk::Error(DOPT_ERR_STATE, op_->what() + ": stream_wait before it was launched");
  cudaError_t e = a_.cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev->get(), 0);
  if (e != cudaSuccess)
    throw sdk::Error(DOPT_ERR_COMM,
                     op_->what() + ": cudaStreamWaitEvent failed: " + cuda_error(a_, e));
}

}  // namespace distopt::plugins::nccl
