// Sharded checkpoints: what Runtime::save_checkpoint writes, load_checkpoint
// reads, consolidate gathers. Layout of a checkpoint directory DIR:
//
//   DIR/latest                        name of the newest complete checkpoint
//   DIR/step-000000120/manifest.json  world size, step, algorithm / reducer /
//                                     optimizer (plugin, version, options),
//                                     host ABI, loss-scale state, learning
//                                     rates set with set_lr, the
//                                     application's `extra` (data-loader
//                                     position), and per shard file its
//                                     size and CRC-32
//   DIR/step-000000120/rank-00001-of-00004.pt   one per rank (torch pickle)
//
// Each file is written to a temporary name, fsynced and renamed; `latest`
// changes (the same way) only after every rank's shard and the manifest are
// durable, so a crash or a killed rank mid-save leaves the previous
// checkpoint intact and loadable. Shards hold the pieces each rank's
// algorithm and reducer put through the ABI 1.1 state writer (distopt/state.h)
// plus, on rank 0, the model's parameters and buffers; loading reads the
// element ranges each rank owns now, which is what lets a ZeRO checkpoint of W
// ranks load into W' ranks.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace distopt {

// Thread safety: find_checkpoint and consolidate_checkpoint only read the
// directory (consolidate_checkpoint writes out_path) and may run from any
// thread; Runtime's save_checkpoint / load_checkpoint / consolidate are
// collectives for the training thread, between steps.

/// Application state stored verbatim in the manifest (e.g. epoch, batch index).
using CheckpointExtra = std::map<std::string, std::string>;

/// What a checkpoint holds, from its manifest.
struct CheckpointInfo {
  std::string path;       ///< the step directory (DIR/step-...)
  int64_t step = 0;       ///< DistributedOptimizer::steps() when it was saved
  int world_size = 0;     ///< ranks that wrote it
  std::string algorithm;  ///< "plugin/component" of the algorithm
  std::string reducer;    ///< "plugin/component" of the reducer
  std::string optimizer;  ///< inner optimizer name ("adam")
  CheckpointExtra extra;  ///< what the application passed to save_checkpoint
};

/// The newest complete checkpoint in `dir` (the one DIR/latest names), or
/// nullopt when there is none (no `latest`). Reads the manifest only. Throws
/// CheckpointError naming the file for an unreadable or invalid manifest.
std::optional<CheckpointInfo> find_checkpoint(const std::string& dir);

/// Offline consolidation (`distopt checkpoint consolidate DIR OUT`): read
/// every shard of the newest checkpoint in `dir` (verifying sizes and CRCs),
/// assemble each logical tensor whole and write them to `out_path` with
/// PyTorch's zip format without type tags (as torch.save writes it), so
/// Python's torch.load(out_path), weights_only=True included, returns
///   {"format": "distopt-consolidated-1", "step": int, "world_size": int,
///    "algorithm": str, "reducer": str, "optimizer": str,
///    "model": {name: tensor},                    # parameters and buffers
///    "optimizer_state": {param: {field: tensor}},  # inner-optimizer state
///    "state": {key: tensor}}                     # every other logical tensor
/// (rank-local entries, e.g. error feedback, appear as "<key>@rank<r>").
/// Written atomically. Throws CheckpointError naming the file.
void consolidate_checkpoint(const std::string& dir, const std::string& out_path);

}  // namespace distopt
