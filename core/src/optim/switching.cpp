// DistributedOptimizer::switch_to and the `schedule:` phases: agree on the
// parameters, then rebuild with other components (optim/rebuild.hpp).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstring>

#include "base/services.hpp"
#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/sdk/base/fnv1a.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"
#include "state/exchange.hpp"

namespace distopt {
namespace {

using Impl = DistributedOptimizer::Impl;

// What every rank must pass identically: the components and their options.
int64_t choice_hash(const optim::ComponentChoice& c) {
  sdk::Fnv1a h;
  h.field(c.algorithm.plugin_name + "/" + c.algorithm.name);
  h.field(c.reducer.plugin_name + "/" + c.reducer.name);
  for (const auto* o : {c.algorithm_options.get(), c.reducer_options.get()})
    for (const auto& [key, value] : o->values()) {
      h.field(key);
      std::visit(
          [&](const auto& v) {
            if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>)
              h.field(v);
            else
              h.value(v);
          },
          value);
    }
  return h.digest_i64();
}

// Every rank takes the replicas' mean (the current algorithm keeps local
// replicas, so they differ); afterwards they are bitwise equal.
void agree_on_parameters(DistributedOptimizer& opt) {
  Impl& m = optim::Access::of(opt);
  if (!opt.replicas_differ()) return;
  DistributedOptimizer::ReplicaAverage avg = opt.average_replicas();
  at::NoGradGuard ng;
  for (size_t i = 0; i < m.build.params.size(); ++i) {
    m.build.params[i].second.detach().copy_(avg.params[i].second);
    if (m.masters) m.masters->master(i).copy_(avg.params[i].second);
  }
  log(DOPT_LOG_DEBUG, "optimizer",
      "switch: replicas averaged (consensus distance " + std::to_string(avg.consensus_distance) +
          ")");
}

// Requests of the last backward may be in flight on the communicator: any
// collective now could interleave with them. Local, before any collective
// (every rank of an SPMD program is in the same state).
void require_between_steps(const Impl& m, const std::string& what) {
  if (m.launched)
    throw Error(what +
                ": a backward launched gradient buckets whose step() has not run; call step() "
                "first (switching goes between steps)");
}

void switch_components(DistributedOptimizer& opt, const optim::ComponentChoice& choice, int phase,
                       const std::string& what) {
  Impl& m = optim::Access::of(opt);
  agree_on_parameters(opt);
  const std::string from = m.algorithm_who + " + " + m.reducer_who;
  optim::OptimizerBuild b = m.build;
  optim::use_components(b, choice);
  b.phase = phase;
  optim::rebuild(opt, std::move(b), nullptr, what);
  Impl& now = optim::Access::of(opt);
  log(now.build.common.rank == 0 ? DOPT_LOG_INFO : DOPT_LOG_DEBUG, "optimizer",
      what + " at step " + std::to_string(now.steps) + ": " + from + " -> " + now.algorithm_who +
          " + " + now.reducer_who + " (" + std::to_string(now.buckets->num_buckets()) +
          (now.buckets->num_buckets() == 1 ? " bucket)" : " buckets)"));
}

// The last phase whose predecessors' bounds are all reached.
int reached_phase(const Impl& m) {
  int p = m.build.phase;
  while (p >= 0 && static_cast<size_t>(p) + 1 < m.build.schedule.size()) {
    const optim::Phase& ph = m.build.schedule[static_cast<size_t>(p)];
    const bool done = (ph.until_epoch >= 0 && m.epoch >= ph.until_epoch) ||
                      (ph.until_step >= 0 && m.steps >= ph.until_step);
    if (!done) break;
    ++p;
  }
  return p;
}

}  // namespace

namespace optim {
// After a step or set_epoch: move to the phase the bounds say.
void advance_schedule(DistributedOptimizer& opt) {
  const Impl& m = Access::of(opt);
  const int target = reached_phase(m);
  if (target != m.build.phase) opt.switch_to_phase(target);
}
}  // namespace optim

void DistributedOptimizer::switch_to(const ComponentConfig& algorithm,
                                     const ComponentConfig& reducer) {
  Impl& m = *impl_;
  require_between_steps(m, "switch_to");
  const int rank = m.build.common.rank, world = m.world_size;
  optim::ComponentChoice choice;
  std::string bad;
  try {
    if (!m.build.resolve) throw ConfigError("this optimizer has no job to resolve components in");
    choice = m.build.resolve(algorithm, reducer);
  } catch (const std::exception& e) {
    bad = e.what();
  }
  optim::agree_on_call(m.build.control, rank, world, bad.empty() ? "" : "switch_to: " + bad,
                       bad.empty() ? choice_hash(choice) : 0, "switch_to", "components or options");
  switch_components(*this, choice, m.build.phase, "switch_to");
}

void DistributedOptimizer::switch_to_phase(int phase) {
  const Impl& m = *impl_;
  if (phase < 0 || static_cast<size_t>(phase) >= m.build.schedule.size())
    throw ConfigError("schedule: no phase " + std::to_string(phase) + " (the job has " +
                      std::to_string(m.build.schedule.size()) + ")");
  require_between_steps(m, "schedule phase " + std::to_string(phase));
  switch_components(*this, m.build.schedule[static_cast<size_t>(phase)].choice, phase,
                    "schedule phase " + std::to_string(phase));
}

void DistributedOptimizer::set_epoch(int64_t epoch) {
  impl_->epoch = epoch;
  optim::advance_schedule(*this);
}

int DistributedOptimizer::schedule_phase() const { return impl_->build.phase; }

}  // namespace distopt
