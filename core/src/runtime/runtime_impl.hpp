// Private: the state behind distopt::Runtime, for runtime/ only (elastic/
// sees what it may change through runtime/elastic_link.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/device_rule.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/process.hpp"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"
#include "distopt/store.hpp"
#include "runtime/membership.hpp"

namespace distopt {

struct Runtime::Impl {
  JobConfig cfg;
  ProcessInfo proc;
  PluginRegistry registry;
  ValidatedJob validated;
  std::string rendezvous;
  std::string bind_address;
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> comm;     // destroyed before the store
  std::unique_ptr<Communicator> control;  // host-memory companion; null: comm serves
  int next_optimizer = 0;
  // Elastic training: this process's stable id (its first rank, plus
  // 1000000 per launcher restart), the membership's generation and its
  // members' ids in rank order (elastic/ keeps them current), and whether
  // the process is joining a running job (a restarted rank): then
  // from_config connected it through the job's next membership and
  // make_optimizer broadcasts nothing (distopt::Elastic's constructor
  // takes the state from the peers).
  int64_t member = 0;
  int64_t generation = 0;
  std::vector<int64_t> members;
  bool joining = false;
  int initial_world_size = 1;   // the launcher's world size (elastic.max_ranks 0)
  runtime::Decision joined_by;  // joining: the membership that took it in
  // Buffers of operations left in flight on the communicators (an elastic
  // commit's buddy exchange when distopt::Elastic goes first): kept until
  // the communicators are gone.
  std::vector<std::shared_ptr<void>> keep_until_disconnect;

  /// The communicator for a collective on memory of `device_type`: the
  /// job's when it accepts it, else the control communicator (host memory).
  /// Deterministic, so every rank issues the collective on the same one.
  Communicator& comm_for(int32_t device_type) const {
    if (!control || device_accepted(comm->devices(), device_type)) return *comm;
    return *control;
  }
  Communicator& control_comm() const { return control ? *control : *comm; }

  /// Elastic recovery (elastic/): drop the communicators (after the
  /// optimizers built on them are gone), then create them again for the
  /// new membership `proc` under store prefix `prefix` (re-validating the
  /// job for the new world size, options updated in place). Collective
  /// over the new membership. Throws as from_config.
  void disconnect();
  void reconnect(const ProcessInfo& proc, const std::string& prefix);

  ~Impl() {
    control.reset();
    comm.reset();
    keep_until_disconnect.clear();
  }
};

}  // namespace distopt
