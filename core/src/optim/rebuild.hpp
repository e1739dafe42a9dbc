// Private: replace a DistributedOptimizer's components (add_param_group,
// switch_to, autotuning) while keeping its state, through the checkpoint
// machinery: every component saves its state as element ranges of logical
// per-parameter tensors, readable under any other partition or component.
//
// Protocol (collective, the same order on every rank):
//   1. snapshot this rank's algorithm + reducer state, exchange all shards;
//   2. build the replacement next to the old optimizer (which stays intact),
//      load the state into it, carry the host-side state over;
//   3. agree: all ranks swap to the replacement, or all keep the old
//      optimizer and throw.
// Building the replacement before destroying the old one makes a failure
// recoverable: both are alive briefly (about twice the optimizer state and
// gradient buckets).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "optim/optimizer_builder.hpp"
#include "state/shard_state.hpp"

namespace distopt::optim {

/// Before a rebuild: every rank's verdict on its own arguments (`bad`: ""
/// when fine, else the reason) and a hash of them are gathered. Throws
/// ConfigError on every rank, before anything changed, when a rank found its
/// arguments bad (this rank: `bad` itself) or passed others than rank 0
/// (`differ` names what: "components or options"). `what` names the call.
/// Collective; throws CommError.
void agree_on_call(const dopt_comm_ref& comm, int rank, int world, const std::string& bad,
                   int64_t hash, const std::string& what, const std::string& differ);

/// Rebuild `opt` from `build` (the old build, amended) with the old state.
/// `amend` may add state to the exchanged shards before they are loaded
/// (add_param_group: fresh Adagrad state for new parameters). `what` names
/// the operation in errors ("add_param_group"). Requires no bucket in flight.
/// Throws on every rank (the optimizer unchanged) when any rank fails:
/// ComponentError, CheckpointError, CommError, Error.
void rebuild(DistributedOptimizer& opt, OptimizerBuild build,
             const std::function<void(std::vector<state::ShardState>&)>& amend,
             const std::string& what);

/// Whether `opt` holds its components (false between detach() and
/// reattach(), e.g. after a recovery failed half-way). Local.
bool attached(DistributedOptimizer& opt);

/// Elastic recovery, first half: destroy `opt`'s components (their hooks,
/// threads and requests; the communicators they used may have failed) and
/// return its build, with the bytes it sent counted in, for reattach().
/// `opt` holds no optimizer until then. Local.
OptimizerBuild detach(DistributedOptimizer& opt, uint64_t* bytes_sent);

/// Elastic recovery, second half: build `opt` again from `build` (whose
/// communicators, rank, world size and scope, unique to the new
/// membership, the caller replaced), with empty
/// state (restore a commit next) and `bytes_sent` as its byte count so far.
/// The buffer synchroniser moves to the new communicator. Collective over
/// the new communicators (components may exchange addresses).
void reattach(DistributedOptimizer& opt, OptimizerBuild build, uint64_t bytes_sent);

}  // namespace distopt::optim
