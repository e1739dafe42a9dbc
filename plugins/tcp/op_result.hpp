// What an operation of the progress thread reports, and the SDK names the
// plugin uses. The TCP path's collectives are the SDK's p2p ones
// (sdk/p2p_collectives.hpp) over SocketTransport; the shared-memory path is
// the SDK's (sdk/shm_collectives.hpp), whose Result is the outcome type of
// every operation here.
#pragma once

#include "distopt/sdk/fault_point.hpp"
#include "distopt/sdk/reduce_kernels.hpp"
#include "distopt/sdk/shm_collectives.hpp"
#include "socket.hpp"

namespace distopt::plugins::tcp {

using sdk::DType;
using sdk::FaultPoint;
using ShmWaitCtx = sdk::shm::WaitCtx;

/// The outcome of one operation: status, `why` naming the peer on failure
/// ("connection to rank 1 lost (peer closed)"), the failed peer, bytes moved.
using OpResult = sdk::shm::Result;

}  // namespace distopt::plugins::tcp
