// DistributedOptimizer::switch_to and the `schedule:` phases: agree on the
// parameters, then rebuild with other components (optim/rebuild.hpp).
#include <ATen/ATen.h>

#include <cstring>

#include "checkpoint/exchange.hpp"
#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"

namespace distopt {
namespace {

using Impl = DistributedOptimizer::Impl;

// FNV-1a over the components and their validated options.
int64_t choice_hash(const optim::ComponentChoice& c) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char b : s) h = (h ^ b) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator
  };
  mix(c.algorithm.plugin_name + "/" + c.algorithm.name);
  mix(c.reducer.plugin_name + "/" + c.reducer.name);
  for (const auto* o : {c.algorithm_options.get(), c.reducer_options.get()})
    for (const auto& [key, value] : o->values()) {
      mix(key);
      mix(std::visit(
          [](const auto& v) -> std::string {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::string>)
              return v;
            else {
              std::string s(sizeof v, '\0');
              std::memcpy(s.data(), &v, sizeof v);
              return s;
            }
          },
          value));
    }
  int64_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
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

void switch_components(DistributedOptimizer& opt, const optim::ComponentChoice& choice, int phase,
                       const std::string& what) {
  Impl& m = optim::Access::of(opt);
  if (m.launched)
    throw Error(what +
                ": a backward launched gradient buckets whose step() has not run; call step() "
                "first (switching goes between steps)");
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
          " buckets)");
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
  const int rank = m.build.common.rank, world = m.world_size;
  optim::ComponentChoice choice;
  std::string bad;
  try {
    if (!m.build.resolve) throw ConfigError("switch_to: this optimizer has no job to resolve in");
    choice = m.build.resolve(algorithm, reducer);
  } catch (const std::exception& e) {
    bad = e.what();
  }
  const int64_t hash = bad.empty() ? choice_hash(choice) : 0;
  auto agreed = checkpoint::gather_i64(m.build.comm, rank, world, {bad.empty() ? 0 : 1, hash});
  if (!bad.empty()) throw ConfigError("switch_to: " + bad);
  for (int r = 0; r < world; ++r) {
    if (agreed[2 * static_cast<size_t>(r)] != 0)
      throw ConfigError("switch_to failed on rank " + std::to_string(r) +
                        " (bad components or options there); the optimizer is unchanged");
    if (agreed[2 * static_cast<size_t>(r) + 1] != agreed[1])
      throw ConfigError("switch_to: rank " + std::to_string(r) +
                        " asked for other components or options than rank 0; every rank must "
                        "make the same call");
  }
  switch_components(*this, choice, m.build.phase, "switch_to");
}

void DistributedOptimizer::switch_to_phase(int phase) {
  const Impl& m = *impl_;
  if (phase < 0 || static_cast<size_t>(phase) >= m.build.schedule.size())
    throw ConfigError("schedule: no phase " + std::to_string(phase) + " (the job has " +
                      std::to_string(m.build.schedule.size()) + ")");
  switch_components(*this, m.build.schedule[static_cast<size_t>(phase)].choice, phase,
                    "schedule phase " + std::to_string(phase));
}

void DistributedOptimizer::set_epoch(int64_t epoch) {
  impl_->epoch = epoch;
  optim::advance_schedule(*this);
}

int DistributedOptimizer::schedule_phase() const { return impl_->build.phase; }

}  // namespace distopt
