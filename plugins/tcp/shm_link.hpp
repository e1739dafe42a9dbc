// tcp's handle on the SDK's shared-memory collectives
// (sdk/shm_collectives.hpp), used when every rank is on one host: the same
// calls, with results as the RingResult that tcp's progress thread reads.
#pragma once

#include <memory>
#include <utility>

#include "distopt/sdk/shm_collectives.hpp"
#include "ring.hpp"

namespace distopt::plugins::tcp {

using sdk::FaultPoint;
using ShmWaitCtx = sdk::shm::WaitCtx;

/// Owns an sdk::shm::Collectives; see it for arguments and thread safety.
class ShmLink {
 public:
  explicit ShmLink(std::unique_ptr<sdk::shm::Collectives> c) : c_(std::move(c)) {}

  RingResult allreduce(const char* send, char* recv, size_t count, DType dt, dopt_reduce_op op,
                       const ShmWaitCtx& ctx) {
    return ring_result(c_->allreduce(send, recv, count, dt, op, ctx));
  }
  RingResult reduce_scatter(const char* send, char* recv, size_t count, DType dt, dopt_reduce_op op,
                            const ShmWaitCtx& ctx) {
    return ring_result(c_->reduce_scatter(send, recv, count, dt, op, ctx));
  }
  RingResult allgather(const char* send, char* recv, size_t bytes, const ShmWaitCtx& ctx) {
    return ring_result(c_->allgather(send, recv, bytes, ctx));
  }
  RingResult broadcast(char* buf, size_t bytes, int root, const ShmWaitCtx& ctx) {
    return ring_result(c_->broadcast(buf, bytes, root, ctx));
  }

 private:
  static RingResult ring_result(sdk::shm::Result r) {
    RingResult out;
    out.status = r.status;
    out.why = std::move(r.why);
    out.peer = r.peer;
    out.bytes_sent = r.bytes_sent;
    out.bytes_received = r.bytes_received;
    return out;
  }

  std::unique_ptr<sdk::shm::Collectives> c_;
};

}  // namespace distopt::plugins::tcp
