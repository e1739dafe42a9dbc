// In-memory state movement between ranks for DistributedOptimizer::
// add_param_group: take this rank's algorithm and reducer state (what a
// checkpoint shard holds, without the model), and give every rank every
// rank's, so that state can be read back under a new partition (ownership
// changes, so a rank may need any other rank's pieces). Collectives go over
// the optimizer's communicator (a dopt_comm_ref: the Runtime is not reachable
// from the optimizer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/shard_state.hpp"
#include "distopt/communicator.h"
#include "distopt/distributed_optimizer.hpp"

namespace distopt::checkpoint {

/// Key prefixes of the components' entries (as in checkpoint shards).
extern const std::string kAlgorithmPrefix;  ///< "algorithm/"
extern const std::string kReducerPrefix;    ///< "reducer/"

/// Throws ComponentError(UNSUPPORTED) naming the algorithm or reducer plugin
/// when it was built for ABI 1.0 (no save_state / load_state).
void require_state_api(DistributedOptimizer::Impl& m);

/// Add this rank's reducer and algorithm state (save_state of each, keys
/// prefixed as above) to `s`. Throws as require_state_api, or the plugin's
/// own error.
void snapshot_components(DistributedOptimizer::Impl& m, ShardState& s);

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

}  // namespace distopt::checkpoint
