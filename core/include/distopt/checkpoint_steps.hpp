// Choosing one checkpoint of a directory: every step it holds, one by number.
// A step directory (DIR/step-000000117, the one holding manifest.json) is
// accepted wherever checkpoint.hpp takes a checkpoint directory
// (find_checkpoint, Runtime::load_checkpoint, consolidate_checkpoint): it
// names that checkpoint instead of the newest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distopt/checkpoint.hpp"

namespace distopt {

/// Every complete checkpoint in `dir` (step directories with a manifest), by
/// step, oldest first; for a step directory, that one. Throws CheckpointError
/// when `dir` cannot be read or a manifest is invalid (naming the file).
std::vector<CheckpointInfo> list_checkpoints(const std::string& dir);

/// The step directory of the checkpoint of `step` in `dir` (a step saved
/// twice: the one DIR/latest names, else the newer). Throws CheckpointError
/// listing the steps there when there is none.
std::string checkpoint_step_path(const std::string& dir, int64_t step);

}  // namespace distopt
