// The streaming engine behind every collective: one byte stream goes to the
// next rank and one comes from the previous rank, concurrently, on
// non-blocking sockets. Received bytes are reduced (or copied) as soon as
// they arrive, and what was reduced may be forwarded at once, so ring steps
// pipeline at byte granularity instead of waiting for whole chunks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "distopt/abi.h"
#include "distopt/sdk/fault_point.hpp"
#include "distopt/sdk/reduce_kernels.hpp"
#include "socket.hpp"

namespace distopt::plugins::tcp {

// The reduction kernels live in the SDK (shared with the p2p collectives).
using sdk::divide;
using sdk::DType;
using sdk::dtype_from_dl;
using sdk::dtype_size;
using sdk::FaultPoint;
using sdk::reduce;

/// Where incoming bytes go. local == nullptr: copied into dst. Otherwise
/// dst = local (op) incoming, then divided by `divisor` if > 1 (averages).
struct RecvSeg {
  char* dst;
  const char* local;
  size_t len;  ///< bytes, a multiple of the element size
  int divisor;
};

struct SendSeg {
  const char* src;
  size_t len;
};

/// One rank's part of a ring transfer. The send stream is the concatenation
/// of `sends`; its first `send_free` bytes are ready at once, and byte
/// send_free + k may go only after k bytes of the receive stream completed
/// (the forwarded data is what was just received). Both streams may be empty.
struct RingPlan {
  int send_peer = -1;  ///< rank the send stream goes to (-1: none)
  int recv_peer = -1;  ///< rank the receive stream comes from (-1: none)
  std::vector<SendSeg> sends;
  size_t send_free = 0;
  std::vector<RecvSeg> recvs;
  DType dtype = DType::F32;
  dopt_reduce_op op = DOPT_REDUCE_SUM;
};

struct RingIo {
  int send_fd = -1;
  int recv_fd = -1;
  char* staging = nullptr;                   ///< scratch for bytes still to be reduced
  size_t staging_bytes = 0;                  ///< multiple of 8
  size_t max_io = 4u << 20;                  ///< bytes per send()/recv() call
  Clock::time_point deadline;                ///< the operation's timeout
  const std::atomic<bool>* abort = nullptr;  ///< set when the communicator failed or is destroyed
  int abort_fd = -1;                         ///< eventfd made readable together with *abort
  FaultPoint* fault = nullptr;               ///< test-only fault injection (sdk/fault_point.hpp)
};

struct RingResult {
  dopt_status status = DOPT_OK;
  std::string why;  ///< on failure: names the peer ("connection to rank 1 lost (peer closed)")
  int peer = -1;    ///< on DOPT_ERR_COMM: the rank whose connection broke
  uint64_t bytes_sent = 0, bytes_received = 0;
};

/// Run the plan to completion, failure or the deadline.
RingResult run_ring(const RingPlan& plan, const RingIo& io);

}  // namespace distopt::plugins::tcp
