// What one rank contributes to a checkpoint and how it is put back: the
// model (parameters and buffers, saved by rank 0), fp32 masters under mixed
// precision, and the reducer's and algorithm's ABI 1.1 state.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "checkpoint/manifest.hpp"
#include "checkpoint/shard_state.hpp"
#include "checkpoint/state_source.hpp"
#include "distopt/distributed_optimizer.hpp"

namespace distopt::checkpoint {

/// This rank's entries. Throws ComponentError(UNSUPPORTED) naming a plugin
/// whose vtable predates ABI 1.1 (no save_state), or the plugin's own error.
ShardState snapshot(torch::nn::Module& model, DistributedOptimizer& opt, int rank);

/// The manifest fields that describe the job (no shard records yet).
Manifest describe(DistributedOptimizer& opt, int world_size);

/// Check that `src` fits `model` / `opt` (every parameter and buffer saved
/// with its shape, same inner optimizer) without changing anything.
/// `where` (the step directory) is named in errors. Throws CheckpointError.
void check_compatible(torch::nn::Module& model, DistributedOptimizer& opt, const StateSource& src,
                      const Manifest& m, const std::string& where);

/// Put the state back (after check_compatible): parameters, buffers,
/// masters, reducer and algorithm load_state, steps, loss-scale state.
void restore(torch::nn::Module& model, DistributedOptimizer& opt, const StateSource& src,
             const Manifest& m);

}  // namespace distopt::checkpoint
