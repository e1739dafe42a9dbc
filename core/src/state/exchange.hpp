// In-memory state movement between ranks (checkpoints' agreement,
// DistributedOptimizer::add_param_group and switch_to): small agreements and
// every rank's state bytes to every rank, so that state can be read back
// under a new partition (ownership changes, so a rank may need any other
// rank's pieces). Collectives go over a dopt_comm_ref (the optimizer's or
// the runtime's control communicator).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distopt/communicator.h"

namespace distopt::state {

/// One int64 per slot from every rank: out[r * mine.size() + i] = rank r's
/// mine[i] (a SUM allreduce of a zero-filled buffer; every rank passes the
/// same number of slots). Collective; world 1 returns `mine`. Throws CommError.
std::vector<int64_t> gather_i64(const dopt_comm_ref& comm, int rank, int world,
                                const std::vector<int64_t>& mine);

/// Every rank's bytes, in rank order (an allgather of variable-size
/// buffers). `mine` is this rank's, or nullopt when it could not make them:
/// the rank still takes part (no rank hangs) and then every rank throws
/// CheckpointError naming the ranks that had none. Sizes go by one
/// allreduce, the bytes by one broadcast per rank, all in flight at once.
/// Collective. Throws CheckpointError, CommError.
std::vector<std::vector<char>> allgather_bytes(std::optional<std::vector<char>> mine,
                                               const dopt_comm_ref& comm, int rank, int world);

/// Send `mine` to rank (rank + 1) mod world and return the bytes rank
/// (rank - 1) mod world sent (elastic commits' buddy copies): the sizes,
/// then the bytes, by send / recv with tags `tag` and `tag` + 1, both
/// directions in flight at once. Collective; world 1 returns `mine`.
/// Throws CommError.
std::vector<char> shift_bytes(const std::vector<char>& mine, const dopt_comm_ref& comm, int rank,
                              int world, int tag);

/// shift_bytes without a synchronisation point: the constructor posts this
/// rank's size and bytes to rank (rank + 1) mod world and the receive of the
/// size from rank (rank - 1) mod world, and returns; the communicator moves
/// them while training goes on. finish() posts the receive of the bytes
/// once the size is known and waits for everything. Tags `tag` and `tag` +
/// 1: one exchange per tag pair in flight. Keeps `mine` until finished.
/// Every rank must finish (or abandon) its own. The communicator must
/// outlive this object; destroying it unfinished waits as finish() does
/// (errors dropped). Not thread-safe. Throws CommError.
class ShiftInFlight {
 public:
  ShiftInFlight(std::vector<char> mine, const dopt_comm_ref& comm, int rank, int world, int tag);
  ShiftInFlight(const ShiftInFlight&) = delete;
  ShiftInFlight& operator=(const ShiftInFlight&) = delete;
  ~ShiftInFlight();
  /// The bytes rank (rank - 1) mod world sent; blocks until every request
  /// has completed. Throws CommError when they did not arrive (a failed
  /// send alone does not throw: the receiver's side decides). A second
  /// call throws CommError. world 1: `mine`.
  std::vector<char> finish();
  /// Non-blocking: post the receive of the bytes if their size has arrived
  /// (so that finish() later finds them received). Throws CommError.
  void progress();
  /// Wait at most timeout_ms until this rank's sends have completed (the
  /// transport has taken the bytes). false on timeout; throws CommError.
  bool wait_sent(int64_t timeout_ms);
  /// Stop waiting: release the requests (the operations go on, their
  /// results discarded) and return what owns the buffers they use, to keep
  /// until the communicator is destroyed. Null when finished.
  std::shared_ptr<void> abandon();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distopt::state
