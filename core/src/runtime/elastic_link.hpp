// Private: what elastic/ may see and change of a Runtime, and nothing more:
// the process's place in the job, its membership (member id, generation,
// members), the store and the communicators, and the two steps of a
// membership change (disconnect, reconnect). elastic/ holds no other door
// into Runtime::Impl. Not thread-safe: the training thread's Elastic calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/process.hpp"
#include "distopt/runtime.hpp"
#include "distopt/store.hpp"
#include "runtime/membership.hpp"

namespace distopt::runtime {

class ElasticLink {
 public:
  explicit ElasticLink(Runtime& rt);

  const JobConfig& config() const;
  /// This process's rank and world size in the current membership.
  const ProcessInfo& process() const;
  Store& store() const;
  Communicator& communicator() const;
  /// The host-memory communicator (the job's when it serves host memory).
  Communicator& control_communicator() const;

  /// This process's member id (distopt/elastic_membership.hpp) for the job.
  int64_t member() const;
  int64_t generation() const;
  /// Member ids in rank order.
  const std::vector<int64_t>& members() const;
  /// The launcher's world size (elastic.max_ranks 0: the largest world).
  int initial_world_size() const;
  /// A process that joined a running job: the membership that took it in
  /// (valid while joining()); joined() once it holds the peers' state.
  bool joining() const;
  const Decision& joined_by() const;
  void joined();

  /// Enter generation `generation` with `members` (rank order).
  void enter(int64_t generation, const std::vector<int64_t>& members);
  /// Drop the communicators (after the optimizers built on them are gone).
  void disconnect();
  /// Create them for `proc` in generation `generation` (its store prefix).
  /// Collective over the new membership; throws as Runtime::from_config.
  void reconnect(const ProcessInfo& proc, int64_t generation);
  /// Keep `buffers` of an operation left in flight until disconnect().
  void keep_until_disconnect(std::shared_ptr<void> buffers);

 private:
  Runtime::Impl& m_;
};

}  // namespace distopt::runtime
