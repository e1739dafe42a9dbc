// One operation the `nccl` communicator launched (or queued: send / recv
// wait for their group) and the request the caller holds for it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "api.hpp"
#include "bootstrap.hpp"
#include "distopt/sdk/base/request.hpp"

namespace distopt::plugins::nccl {

/// A CUDA event owned by one or more operations (a send / recv group shares
/// the group's completion event).
class Event {
 public:
  Event(const Api& a, int device);  ///< cudaEventCreateWithFlags(DisableTiming); throws COMM
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  const Api& a_;
  cudaEvent_t e_ = nullptr;
};

/// What the watchdog and the request share. Thread-safe.
class Op {
 public:
  /// `what` names it in every message: "allreduce #7 (1024 float32, sum)".
  explicit Op(std::string what) : what_(std::move(what)) {}
  const std::string& what() const { return what_; }

  /// Launched: completion is `done` (recorded on the communicator's stream),
  /// the watchdog's deadline `deadline`.
  void launched(std::shared_ptr<Event> done, Clock::time_point deadline);
  bool is_launched() const;
  std::shared_ptr<Event> event() const;  ///< null until launched
  Clock::time_point deadline() const;

  /// The first call wins: the request then fails with `status` and `message`.
  void fail(dopt_status status, const std::string& message);
  /// Non-blocking: true when the device work is done; throws sdk::Error when
  /// failed (or when cudaEventQuery reports an error). Not launched: false.
  bool poll(const Api& a);

 private:
  const std::string what_;
  mutable std::mutex mu_;
  std::shared_ptr<Event> done_;
  Clock::time_point deadline_{};
  bool finished_ = false;
  dopt_status status_ = DOPT_OK;
  std::string message_;
};

/// The sdk::Request of one Op. `flush` launches queued send / recv groups
/// (the owning communicator's, while it lives) before the request is
/// polled, so that a caller waiting on a send never waits on a queue.
class OpRequest : public sdk::Request {
 public:
  OpRequest(const Api& a, std::shared_ptr<Op> op, int device, std::function<void()> flush);
  bool test() override;
  /// timeout_ms < 0: until completion or failure (the watchdog fails it at
  /// timeout_s); else false at that limit, the operation going on.
  bool wait(int64_t timeout_ms) override;
  /// cudaStreamWaitEvent(stream, completion): no host blocking.
  void stream_wait(void* stream) override;

 private:
  void ensure_launched();
  const Api& a_;
  std::shared_ptr<Op> op_;
  int device_;
  std::function<void()> flush_;
};

}  // namespace distopt::plugins::nccl
