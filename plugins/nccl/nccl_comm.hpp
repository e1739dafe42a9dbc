// The `nccl` communicator: NCCL collectives on kDLCUDA tensors, ordered on
// the caller's CUDA stream as distopt/communicator.h ("Device memory") says.
//
// Create (collective): load NCCL and the CUDA runtime (api.hpp; missing, or
// no usable device: DOPT_ERR_UNSUPPORTED naming why), pick the device
// (`device`, or local_rank % device count), exchange the ncclUniqueId
// through the store and init non-blocking (bootstrap.hpp), start the
// watchdog (watchdog.hpp).
//
// Operations: each launches on the communicator's own stream after an event
// recorded on the caller stream (set_stream; default the legacy default
// stream), then records a completion event that the request tests
// (cudaEventQuery) and waits on (host polling, or stream_wait). Operations
// are launched in call order under one mutex (NCCL requires one order on
// every rank). send / recv are queued and launched together in one
// ncclGroupStart/End group when the next other operation is issued or any
// of their requests is tested / waited on, so an exchange (both ranks send,
// then recv) cannot deadlock; tags are not matched (NCCL matches send and
// recv in order per peer). barrier is a 1-element int32 allreduce.
//
// Timeouts (timeout_s, default 600 s as c10d's NCCL default): init must
// finish within it; each operation must complete within it from its
// launch, else the watchdog aborts the communicator and fails every pending
// request with a message naming the operation (TIMEOUT for the late one's
// message, every pending request fails). A wait with a limit of its own
// returns TIMEOUT at that limit and the operation goes on; wait(-1) waits
// until completion or the watchdog's failure. After an abort every
// operation is refused (DOPT_ERR_ABORTED); make a new communicator.
// ncclCommAbort hanging longer than abort_grace_s ends the process (exit
// status 134, reason on stderr).
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
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(const Api& a, const Settings& s, int rank, int world, int device, ncclComm_t comm);
  ~Core();  ///< shutdown()
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

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
  std::shared_ptr<Core> split(int color, int key);
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

class NcclComm : public sdk::Communicator {
 public:
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCUDA);

  explicit NcclComm(const dopt_create_args& args);
  explicit NcclComm(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~NcclComm() override;

  int32_t rank() const override { return core_->rank; }
  int32_t world_size() const override { return core_->world; }
  std::unique_ptr<sdk::Request> allreduce(const DLTensor& send, DLTensor& recv,
                                          dopt_reduce_op op) override;
  std::unique_ptr<sdk::Request> reduce_scatter(const DLTensor& send, DLTensor& recv,
                                               dopt_reduce_op op) override;
  std::unique_ptr<sdk::Request> allgather(const DLTensor& send, DLTensor& recv) override;
  std::unique_ptr<sdk::Request> broadcast(DLTensor& buf, int32_t root) override;
  std::unique_ptr<sdk::Request> send(const DLTensor& buf, int32_t peer, int32_t tag) override;
  std::unique_ptr<sdk::Request> recv(DLTensor& buf, int32_t peer, int32_t tag) override;
  std::unique_ptr<sdk::Request> barrier() override;
  std::unique_ptr<sdk::Communicator> split(int32_t color, int32_t key) override;
  void set_stream(void* stream) override { core_->set_caller_stream(stream); }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace distopt::plugins::nccl
