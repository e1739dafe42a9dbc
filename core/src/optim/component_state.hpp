// The reducer's and algorithm's ABI 1.1 state as checkpoints, add_param_group
// and switch_to take it: keys under "reducer/" and "algorithm/" in a
// state::ShardState.
#pragma once

#include <string>

#include "distopt/distributed_optimizer.hpp"
#include "state/shard_state.hpp"

namespace distopt::optim {

/// Key prefixes of the components' entries (as in checkpoint shards).
extern const std::string kAlgorithmPrefix;  ///< "algorithm/"
extern const std::string kReducerPrefix;    ///< "reducer/"

/// Throws ComponentError(UNSUPPORTED) naming the algorithm or reducer plugin
/// when it was built for ABI 1.0 (no save_state / load_state).
void require_state_api(DistributedOptimizer::Impl& m);

/// Add this rank's reducer and algorithm state (save_state of each, keys
/// prefixed as above) to `s`. Throws as require_state_api, or the plugin's
/// own error.
void snapshot_components(DistributedOptimizer::Impl& m, state::ShardState& s);

}  // namespace distopt::optim
