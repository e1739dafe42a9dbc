// One thread that runs a component's tasks in submission order. Reducers
// whose reduction is a chain of blocking collectives (powersgd: P, then Q;
// hierarchical: within the node, across nodes, within the node) run it there,
// so reduce() returns at once and every rank issues its collectives in the
// same order (one thread issues them; reducer.h). Torch-free.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/request.hpp"

namespace distopt::sdk {

/// Declare it as the last member of its owner: it is destroyed first, so the
/// worker stops before the state its tasks use goes away.
class SerialWorker {
 public:
  /// `who` prefixes error messages ("powersgd").
  explicit SerialWorker(std::string who) : who_(std::move(who)), thread_([this] { loop(); }) {}
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;
  ~SerialWorker() { stop(); }

  /// Lets the running task finish, completes every queued one with
  /// DOPT_ERR_ABORTED ("<who>: destroyed before <label> ran") and joins; later
  /// submits throw. Idempotent. Call it from the owner's destructor when the
  /// owner must act after the last task (final counts); not from a task.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Queue `task`; the worker runs it after the tasks submitted before, then
  /// completes `done`: DOPT_OK when it returns, the status of an sdk::Error
  /// it throws (DOPT_ERR_INTERNAL for another exception) with the message
  /// "<who>: <label>: <what>". Thread-safe. Throws sdk::Error(DOPT_ERR_STATE)
  /// once destruction has begun.
  void submit(std::function<void()> task, std::shared_ptr<Completion> done, std::string label) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) throw Error(DOPT_ERR_STATE, who_ + ": shutting down");
      queue_.push_back({std::move(task), std::move(done), std::move(label)});
    }
    cv_.notify_one();
  }

 private:
  struct Task {
    std::function<void()> run;
    std::shared_ptr<Completion> done;
    std::string label;
  };

  void loop() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) {
          for (auto& q : queue_)
            q.done->complete(DOPT_ERR_ABORTED, who_ + ": destroyed before " + q.label + " ran");
          queue_.clear();
          return;
        }
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        t.run();
        t.done->complete(DOPT_OK);
      } catch (const Error& e) {
        t.done->complete(e.status(), who_ + ": " + t.label + ": " + e.what());
      } catch (const std::exception& e) {
        t.done->complete(DOPT_ERR_INTERNAL, who_ + ": " + t.label + ": " + e.what());
      }
    }
  }

  std::string who_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the queue exists
};

}  // namespace distopt::sdk
