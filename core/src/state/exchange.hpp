// In-memory state movement between ranks (checkpoints' agreement,
// DistributedOptimizer::add_param_group and switch_to): small agreements and
// every rank's state bytes to every rank, so that state can be read back
// under a new partition (ownership changes, so a rank may need any other
// rank's pieces). Collectives go over a dopt_comm_ref (the optimizer's or
// the runtime's control communicator).
#pragma once

#include <cstdint>
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

}  // namespace distopt::state
