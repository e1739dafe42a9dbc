// What an operation of the progress thread reports (RingResult), and the
// SDK's reduction kernels under the names the plugin uses. The TCP path's
// collectives are the SDK's p2p ones (sdk/p2p_collectives.hpp) over
// SocketTransport; the shared-memory path (shm_collectives.hpp) returns
// RingResult itself.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/abi.h"
#include "distopt/sdk/fault_point.hpp"
#include "distopt/sdk/reduce_kernels.hpp"
#include "socket.hpp"

namespace distopt::plugins::tcp {

using sdk::divide;
using sdk::DType;
using sdk::dtype_from_dl;
using sdk::dtype_size;
using sdk::FaultPoint;
using sdk::reduce;

/// The outcome of one operation on the progress thread.
struct RingResult {
  dopt_status status = DOPT_OK;
  std::string why;  ///< on failure: names the peer ("connection to rank 1 lost (peer closed)")
  int peer = -1;    ///< on DOPT_ERR_COMM: the rank whose connection broke
  uint64_t bytes_sent = 0, bytes_received = 0;
};

}  // namespace distopt::plugins::tcp
