// What one rank contributes to a checkpoint and how it is put back: the
// model (parameters and buffers, saved by rank 0), fp32 masters under mixed
// precision, and the reducer's and algorithm's ABI 1.1 state. The optimizer's
// side of the directory protocol (state/protocol.hpp), which reaches it
// through checkpoint::Participant only.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "distopt/distributed_optimizer.hpp"
#include "state/manifest.hpp"
#include "state/protocol.hpp"
#include "state/shard_state.hpp"
#include "state/state_source.hpp"

namespace distopt::optim {

/// This rank's entries. Throws ComponentError(UNSUPPORTED) naming a plugin
/// whose vtable predates ABI 1.1 (no save_state), or the plugin's own error.
/// `keep_replicas`: state every rank holds whole (the model, the masters,
/// what components put with put_replicated) is kept on every rank, marked
/// replicated (an elastic commit); otherwise rank 0 alone keeps it (a
/// checkpoint).
state::ShardState snapshot(torch::nn::Module& model, DistributedOptimizer& opt, int rank,
                           bool keep_replicas = false);

/// The manifest fields that describe the job (no shard records yet).
checkpoint::Manifest describe(DistributedOptimizer& opt, int world_size);

/// Check that `src` fits `model` / `opt` (every parameter and buffer saved
/// with its shape, same inner optimizer) without changing anything.
/// `where` (the step directory) is named in errors. Throws CheckpointError.
void check_compatible(torch::nn::Module& model, DistributedOptimizer& opt,
                      const state::StateSource& src, const checkpoint::Manifest& m,
                      const std::string& where);

/// Put the state back (after check_compatible): parameters, buffers,
/// masters, reducer and algorithm load_state, steps, loss-scale state.
void restore(torch::nn::Module& model, DistributedOptimizer& opt, const state::StateSource& src,
             const checkpoint::Manifest& m);

/// A model and its optimizer as the directory protocol saves and loads them
/// (the functions above, and on load first the saved schedule phase and
/// autotune setting). Borrows both; use on the training thread.
class OptimizerCheckpoint final : public checkpoint::Participant {
 public:
  OptimizerCheckpoint(torch::nn::Module& model, DistributedOptimizer& opt);
  checkpoint::Manifest describe(int world_size) override;
  state::ShardState snapshot(int rank) override;
  void resume(const checkpoint::Manifest& m, const std::string& where) override;
  void check_compatible(const state::StateSource& src, const checkpoint::Manifest& m,
                        const std::string& where) override;
  void restore(const state::StateSource& src, const checkpoint::Manifest& m) override;

 private:
  torch::nn::Module& model_;
  DistributedOptimizer& opt_;
};

}  // namespace distopt::optim
