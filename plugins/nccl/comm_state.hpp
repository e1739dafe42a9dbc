// CommState: everything one NCCL communicator owns (its NCCL communicator, stream,
// send / recv group queue and watchdog) and the launching of operations on
// its stream; NcclComm (nccl_comm.hpp) and its split children share one.
// Defined in comm_state.cpp.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "api.hpp"
#include "distopt/sdk/base/plugin.hpp"
#include "op.hpp"
#include "settings.hpp"
#include "watchdog.hpp"

namespace distopt::plugins::nccl {

/// Everything one NCCL communicator owns; requests keep a weak reference
/// (to launch queued send / recv groups).
class CommState : public std::enable_shared_from_this<CommState> {
 public:
  CommState(const Api& a, const Settings& s, int rank, int world, int device, ncclComm_t comm);
  ~CommState();  ///< shutdown()
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  const Api& a;
  const Settings s;
  const int rank, world, device;

  /// Launch `enqueue` (an NCCL call on the given communicator and stream) as
  /// operation `what`.
  std::unique_ptr<sdk::Request> launch(
      const std::string& what,
      const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& enqueue);
  /// Queue a send (is_send) or recv for the next group.
  std::unique_ptr<sdk::Request> queue_p2p(bool is_send, void* data, size_t count,
                                          ncclDataType_t type, int peer, const std::string& what);
  /// Launch the queued send / recv group, if any.
  void flush();
  /// ncclCommSplit (blocking, collective); nullptr for color < 0.
  std::shared_ptr<CommState> split(int color, int key);
  void set_caller_stream(void* stream) { caller_.store(stream); }
  void* scratch() const { return scratch_; }
  /// "allreduce #7": the kind and its position among this communicator's
  /// operations (the same on every rank when the ranks agree).
  std::string next_name(const char* kind);
  /// Graceful teardown (finalize + destroy) when nothing is pending, else
  /// abort; pending queued send / recv fail with DOPT_ERR_ABORTED.
  void shutdown();

 private:
  struct P2p {
    bool is_send;
    void* data;
    size_t count;
    ncclDataType_t type;
    int peer;
    std::shared_ptr<Op> op;
  };
  void refuse_if_aborted(const std::string& what) const;
  void order_after_caller();
  void launched(const std::vector<std::shared_ptr<Op>>& ops);
  void flush_locked();
  std::unique_ptr<sdk::Request> request(std::shared_ptr<Op> op, bool p2p);
  /// Runs f under the launch mutex; a launch that failed inside NCCL (error
  /// or not settled in time) aborts the communicator before rethrowing.
  template <class F>
  auto locked(F&& f);

  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<Event> ready_;  // recorded on the caller stream at each launch
  void* scratch_ = nullptr;       // barrier's int32 on the device
  std::atomic<void*> caller_{nullptr};
  std::mutex issue_mu_;
  std::vector<P2p> queued_;
  uint64_t seq_ = 0;
  bool shut_ = false;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace distopt::plugins::nccl
