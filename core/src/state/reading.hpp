// Reading the newest checkpoint of a directory, fully verified (manifest,
// every shard's size and CRC-32, shard format). Shared by load_checkpoint
// and offline consolidation.
#pragma once

#include <string>
#include <vector>

#include "state/manifest.hpp"
#include "state/shard_state.hpp"

namespace distopt::checkpoint {

struct Loaded {
  Manifest manifest;
  std::string where;                      ///< the step directory
  std::vector<state::ShardState> shards;  ///< shards[r] = saved rank r's
};

/// The step directory name DIR/latest holds ("" when there is no `latest`).
/// Throws CheckpointError for a `latest` naming no step directory.
std::string latest_name(const std::string& dir);

/// The checkpoint `dir` names: `dir` itself when it is a step directory
/// (holds manifest.json), else DIR/<the name in DIR/latest>; "" when DIR has
/// no `latest`. Throws CheckpointError for a `latest` naming no step.
std::string step_directory(const std::string& dir);

/// The checkpoint step_directory(dir) names. Throws CheckpointError naming
/// the file (no `latest`, bad manifest, a missing, truncated or corrupt shard).
Loaded read_newest(const std::string& dir);

}  // namespace distopt::checkpoint
