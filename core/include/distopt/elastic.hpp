// Elastic training (the job's `elastic:` section): when a rank dies, the
// survivors agree on a new membership through the rendezvous store,
// re-create their communicators and go on from the last in-memory commit,
// with no restart and no disk. After torchft (a quorum per step, process
// groups re-initialised, live state from a peer) and Horovod Elastic
// (state.commit() / restore, min and max workers); unlike both, optimizer
// state sharded across ranks (zero, hybrid shard: true) survives its rank
// through a buddy copy. share/doc/distopt/GUIDE.md, "Elastic training".
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distopt/checkpoint.hpp"
#include "distopt/error.hpp"

namespace distopt {

class Runtime;
class DistributedOptimizer;

/// True for the errors a dead or unreachable peer causes (CommError, and
/// ComponentError with status COMM, ABORTED or TIMEOUT, RendezvousError):
/// the ones Elastic::recover() handles. Config and plugin errors are not.
bool is_peer_failure(const std::exception& e);

/// One rank's side of elastic training: in-memory commits and recovery.
/// Borrows the runtime, the model and the optimizer (they must outlive it).
/// Not thread-safe: the training thread calls everything, between steps.
///
/// The loop (what `distopt train` does; embedding programs do the same):
///
///     Elastic el(rt, *model, opt);
///     el.commit({{"batch", "0"}});
///     for (...) {
///       try {
///         ... forward, backward, opt.step() ...
///         el.maybe_commit({{"batch", std::to_string(next)}});
///       } catch (const std::exception& e) {
///         if (!is_peer_failure(e)) throw;
///         auto r = el.recover();   // new rt.rank() / rt.world_size()
///         next = std::stoll(r.position.at("batch"));
///       }
///     }
class Elastic {
 public:
  /// Throws ConfigError when the job's elastic.enabled is false.
  Elastic(Runtime& rt, torch::nn::Module& model, DistributedOptimizer& opt);
  ~Elastic();
  Elastic(const Elastic&) = delete;
  Elastic& operator=(const Elastic&) = delete;

  /// Every rank, between steps. Keep in this process what a rollback
  /// needs: the model's parameters and buffers, fp32 masters, the
  /// reducer's and algorithm's state through ABI 1.1 save_state (inner
  /// optimizer state, error feedback, PowerSGD's Q, a replica for
  /// decentralized), steps, learning rates, loss scale, schedule phase, and
  /// `position` (the application's data position, returned by recover()).
  /// State every rank holds whole (the model; plain allreduce's optimizer
  /// state, put with ABI 1.6 put_replicated) is copied by ranks 0 and 1
  /// only (both lost together: ElasticError); what this rank alone holds
  /// (a ZeRO shard, error feedback) is also sent to its
  /// buddy, rank (r + 1) mod W, in the background over the control
  /// communicator: no rank waits for another here. A commit counts (is
  /// rolled back to) once its buddy copy has arrived, which the next
  /// commit or a recovery waits for; a rank that dies before its bytes
  /// have left rolls the job back one commit further. The two commits
  /// before the newest are kept, so that ranks that stopped a commit apart
  /// still share one. Memory: up to 3 x (own state + the buddy's, and the
  /// replicated state on ranks 0 and 1), host memory. Throws CommError (a peer died: call
  /// recover()), ComponentError (UNSUPPORTED naming a plugin without save_state). Cost: a host copy
  /// of the state and the buddy's send (bench: tools/bench/elastic.py).
  void commit(const CheckpointExtra& position = {});
  /// commit() when the optimizer has stepped elastic.commit_every times
  /// since the last commit. Returns whether it committed. Then, while the
  /// world is below elastic.max_ranks (0: the starting world size), ranks
  /// asking to join (restarted by `distopt launch --elastic
  /// --max-restarts N`) are taken in: every rank goes through a membership
  /// change (new communicators, the optimizer rebuilt for the larger
  /// world) and the joining ranks receive this commit from the others (one
  /// small allreduce per commit decides it; rank() / world_size() change).
  bool maybe_commit(const CheckpointExtra& position = {});

  /// What recover() did.
  struct Recovery {
    int64_t generation = 0;  ///< the new membership's number (one per recovery)
    int old_world_size = 0, world_size = 0;
    int old_rank = 0, rank = 0;
    std::vector<int> lost;     ///< ranks of the old membership that did not come back
    int64_t step = 0;          ///< optimizer steps of the commit rolled back to
    CheckpointExtra position;  ///< what that commit() was given
    double seconds = 0;        ///< wall time of the recovery on this rank
  };
  /// After a peer failure (is_peer_failure) on this rank, from any point of
  /// a step or a commit: drop the optimizer's components and the runtime's
  /// communicators (the survivors still waiting on this rank see their
  /// connections close), agree on the survivors through the store (a
  /// generation number; the first to arrive closes the membership when
  /// every member has arrived or been declared dead by the elastic
  /// launcher, else after elastic.settle_s, or world.timeout_s with the
  /// launcher), number them densely in their old order, create the
  /// communicators again (every communicator plugin through the ABI's
  /// create, under a new store prefix), rebuild the optimizer for the new
  /// world and restore the newest commit every survivor holds; a lost
  /// rank's state comes from its buddy, and sharded state is resharded as
  /// a checkpoint load would (state_source). Failures during a recovery
  /// (another rank dying) start the next generation. Afterwards
  /// rt.rank(), rt.world_size(), rt.communicator() are the new ones.
  /// Throws ElasticError (see the class), ConfigError when a component
  /// refuses the new world size; after a throw the optimizer and the
  /// runtime's communicators are unusable.
  Recovery recover();

  /// True in a rank that joined a running job (a restarted rank,
  /// Runtime::joining()): the constructor took the job's newest commit from
  /// the peers (collective with them: construct it right after
  /// make_optimizer) and committed with them; go on from position().
  bool rejoined() const;
  /// The data position of the newest commit (what commit() was given).
  CheckpointExtra position() const;

  /// Wait, at most `timeout_s` seconds, until the newest commit's bytes
  /// for the buddy have left this rank (the transport has them: the buddy
  /// keeps them even if this process ends now). For a rank about to leave
  /// on purpose (preemption). Returns false on timeout (a transport that
  /// holds sends until the receiver asks, e.g. a rendezvous protocol).
  /// Throws CommError for a failed send.
  bool flush(double timeout_s);

  /// Generation of the current membership (0 before any recovery).
  int64_t generation() const;
  /// Optimizer steps at the newest commit (-1 before the first).
  int64_t committed_step() const;
  /// Host bytes the commits hold now (own and buddy copies, every slot).
  uint64_t commit_bytes() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace distopt
