// Creating an NCCL communicator: the ncclUniqueId goes from rank 0 to the
// other ranks through the job's rendezvous store, then every rank calls
// ncclCommInitRankConfig with a non-blocking config and polls
// ncclCommGetAsyncError until the communicator is ready or timeout_s passes.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "api.hpp"
#include "distopt/abi.h"
#include "settings.hpp"

namespace distopt::plugins::nccl {

using Clock = std::chrono::steady_clock;

/// NCCL_CONFIG_INITIALIZER with blocking = 0: every call may return
/// ncclInProgress, and NCCL never blocks the calling thread (so a watchdog
/// can abort it).
ncclConfig_t nonblocking_config();

/// Rank 0 makes the id and publishes it under "<scope>/nccl/unique_id"; the
/// others read it (waiting up to timeout_s). Throws sdk::Error: TIMEOUT
/// (rank 0 never published), UNSUPPORTED (rank 0 published its failure),
/// COMM (store or NCCL failure).
ncclUniqueId exchange_unique_id(const Api& a, const dopt_create_args& args, const Settings& s);

/// Rank 0 only, world > 1: publish `reason` (why rank 0 cannot create) in
/// place of the id, so the other ranks fail at once with it instead of
/// waiting timeout_s. Never throws.
void publish_failure(const dopt_create_args& args, const std::string& reason) noexcept;

/// Poll ncclCommGetAsyncError(comm) until it is not ncclInProgress. Throws
/// sdk::Error naming `what`: COMM for an NCCL error, TIMEOUT past
/// `deadline`, ABORTED when *aborted becomes true (may be null).
void settle(const Api& a, ncclComm_t comm, Clock::time_point deadline, const std::string& what,
            const std::atomic<bool>* aborted = nullptr);

/// ncclCommInitRankConfig (non-blocking) on the current device, settled; on
/// timeout or error the half-made communicator is aborted and sdk::Error
/// thrown (TIMEOUT / COMM).
ncclComm_t init_comm(const Api& a, const ncclUniqueId& id, int world, int rank, const Settings& s);

}  // namespace distopt::plugins::nccl
