// The checkpoint directory protocol (distopt/checkpoint.hpp): which files a
// save writes in which order, and how a load reads them back, over the job's
// control communicator. What is saved comes from a Participant (the model and
// its optimizer: optim/snapshot.hpp), so this layer never sees the
// optimizer's insides.
#pragma once

#include <string>

#include "distopt/checkpoint.hpp"
#include "distopt/communicator.h"
#include "state/manifest.hpp"
#include "state/shard_state.hpp"
#include "state/state_source.hpp"

namespace distopt::checkpoint {

/// What the protocol saves and loads. Every method runs on every rank, in
/// the same order; those marked collective use the participant's own
/// communicator. Throw to fail the save or load (the protocol makes every
/// rank fail together).
class Participant {
 public:
  virtual ~Participant() = default;
  /// The manifest fields that describe the job (no shard records yet).
  virtual Manifest describe(int world_size) = 0;
  /// This rank's entries of the checkpoint.
  virtual state::ShardState snapshot(int rank) = 0;
  /// Before checking: adapt to how the checkpoint was saved (schedule
  /// phase, autotune setting). Collective. `where` is the step directory.
  virtual void resume(const Manifest& m, const std::string& where) = 0;
  /// Throw CheckpointError naming `where` if `src` does not fit; change nothing.
  virtual void check_compatible(const state::StateSource& src, const Manifest& m,
                                const std::string& where) = 0;
  /// Put the state back (after check_compatible).
  virtual void restore(const state::StateSource& src, const Manifest& m) = 0;
};

/// The ranks a save or load runs on: their communicator for the
/// protocol's agreements (host memory: the runtime's control communicator).
struct Group {
  dopt_comm_ref comm{nullptr, nullptr};
  int rank = 0;
  int world_size = 1;
};

/// Runtime::save_checkpoint: every rank's shard (atomic rename each) ->
/// agreement -> rank 0's manifest -> rank 0's `latest` (the commit) ->
/// agreement; then rank 0 keeps the newest `keep` step directories.
/// Collective. Throws ConfigError (keep < 1), CheckpointError naming the
/// directory and the rank that failed (the previous checkpoint stays the
/// newest), CommError.
CheckpointInfo save(const std::string& dir, Participant& p, const CheckpointExtra& extra, int keep,
                    const Group& g);

/// Runtime::load_checkpoint: read the newest checkpoint of `dir` (or the
/// step directory `dir`), resume, check, restore; loading never writes.
/// Collective: every rank fails together. Throws CheckpointError naming the
/// file or the rank that could not load, CommError.
CheckpointInfo load(const std::string& dir, Participant& p, const Group& g);

}  // namespace distopt::checkpoint
