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

#include <memory>

#include "comm_state.hpp"
#include "distopt/sdk/base/plugin.hpp"

namespace distopt::plugins::nccl {

class NcclComm : public sdk::Communicator {
 public:
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCUDA);

  explicit NcclComm(const dopt_create_args& args);
  explicit NcclComm(std::shared_ptr<CommState> state) : state_(std::move(state)) {}
  ~NcclComm() override;

  int32_t rank() const override { return state_->rank; }
  int32_t world_size() const override { return state_->world; }
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
  void set_stream(void* stream) override { state_->set_caller_stream(stream); }

 private:
  std::shared_ptr<CommState> state_;
};

}  // namespace distopt::plugins::nccl
