// The rebuild protocol of rebuild.hpp (add_param_group, switch_to).
#include "optim/rebuild.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <exception>
#include <map>
#include <memory>
#include <optional>

#include "base/services.hpp"
#include "distopt/device_rule.hpp"
#include "distopt/error.hpp"
#include "optim/buffer_sync.hpp"
#include "optim/component_state.hpp"
#include "optim/optimizer_impl.hpp"
#include "state/exchange.hpp"
#include "state/state_source.hpp"

namespace distopt::optim {
namespace {

using Impl = DistributedOptimizer::Impl;

// The fp32 masters are the truth (the model holds their rounding): the new
// optimizer's masters start from the old one's, by parameter name. A
// sharded unit's masters are the algorithm's shards: gathered in fp32
// (collective, on every rank alike).
std::shared_ptr<const std::map<std::string, at::Tensor>> full_masters(Impl& old) {
  if (!old.masters) return nullptr;
  auto out = std::make_shared<std::map<std::string, at::Tensor>>();
  for (size_t i = 0; i < old.build.params.size(); ++i)
    if (old.masters->master(i).defined())
      out->emplace(old.build.params[i].first, old.masters->master(i));
  if (old.shards)
    for (size_t u = 0; u < old.shards->num_units(); ++u) {
      const at::Tensor full = old.shards->gather_copy(u, at::kFloat);
      for (const auto& mb : old.shards->unit(u).members)
        (*out)[old.build.params[mb.param].first] =
            full.narrow(0, static_cast<int64_t>(mb.offset), c10::multiply_integers(mb.shape))
                .view(mb.shape);
    }
  return out;
}

// What the host keeps across a rebuild: steps, epoch, learning rates set
// with set_lr, the loss scaler, byte counters.
void carry_host_state(Impl& fresh, const Impl& old) {
  fresh.steps = old.steps;
  fresh.epoch = old.epoch;
  fresh.lr_set = old.lr_set;
  for (size_t g = 0; g < old.lr_set.size() && g < fresh.groups.size(); ++g)
    if (old.lr_set[g] >= 0)
      check_status(fresh.avt->set_lr(fresh.algorithm, static_cast<int32_t>(g), old.lr_set[g]),
                   fresh.algorithm_who, "set_lr(group " + std::to_string(g) + ")");
  if (!fresh.lr_set.empty()) fresh.lr_set.resize(fresh.groups.size(), -1.0);
  if (fresh.scaler && old.scaler) fresh.scaler->set_state(old.scaler->state());
  fresh.bytes_sent_base = old.bytes_sent_base + old.components_bytes_sent();
  const int64_t since = std::max<int64_t>(0, old.steps - old.plain_steps_base);
  fresh.plain_bytes_base =
      old.plain_bytes_base + old.plain_bytes_per_step * static_cast<uint64_t>(since);
  fresh.plain_steps_base = old.steps;
}

// Load the exchanged state into `fresh` and carry over what the host keeps.
void restore_into(Impl& fresh, Impl& old, std::vector<state::ShardState> shards, int rank,
                  int world) {
  at::NoGradGuard no_grad;
  state::StateSource src(std::move(shards), rank, world);
  dopt_state_reader rr = src.reader(&kReducerPrefix);
  check_status(fresh.rvt->load_state(fresh.reducer, &rr), fresh.reducer_who, "load_state");
  dopt_state_reader ar = src.reader(&kAlgorithmPrefix);
  check_status(fresh.avt->load_state(fresh.algorithm, &ar), fresh.algorithm_who, "load_state");
  carry_host_state(fresh, old);
}

// Everyone's state to everyone (ownership may change arbitrarily). A rank
// that cannot save still takes part; then every rank throws.
std::vector<state::ShardState> exchange_state(Impl& old, int rank, int world) {
  std::optional<std::vector<char>> mine;
  std::exception_ptr failure;
  try {
    state::ShardState s;
    snapshot_components(old, s);
    mine = s.pack(rank, world);
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  std::vector<std::vector<char>> bytes;
  try {
    bytes = state::allgather_bytes(std::move(mine), old.build.control, rank, world);
  } catch (const CheckpointError&) {
    if (failure) std::rethrow_exception(failure);  // this rank's own reason
    throw;
  }
  std::vector<state::ShardState> shards;
  for (int r = 0; r < world; ++r)
    shards.push_back(state::ShardState::unpack(
        bytes[static_cast<size_t>(r)], "optimizer state of rank " + std::to_string(r), r, world));
  return shards;
}

}  // namespace

void agree_on_call(const dopt_comm_ref& comm, int rank, int world, const std::string& bad,
                   int64_t hash, const std::string& what, const std::string& differ) {
  auto agreed = state::gather_i64(comm, rank, world, {bad.empty() ? 0 : 1, hash});
  if (!bad.empty()) throw ConfigError(bad);
  for (int r = 0; r < world; ++r) {
    if (agreed[2 * static_cast<size_t>(r)] != 0)
      throw ConfigError(what + " failed on rank " + std::to_string(r) +
                        " (bad arguments there); the optimizer is unchanged");
    if (agreed[2 * static_cast<size_t>(r) + 1] != agreed[1])
      throw ConfigError(what + ": rank " + std::to_string(r) + " passed other " + differ +
                        " than rank 0; every rank must make the same call");
  }
}

dopt_comm_ref comm_for(const OptimizerBuild& b, int32_t device_type) {
  if (b.control.comm == nullptr || device_accepted(b.comm_devices, device_type)) return b.comm;
  return b.control;
}

void use_components(OptimizerBuild& b, const ComponentChoice& choice) {
  b.reducer = choice.reducer;
  b.algorithm = choice.algorithm;
  b.reducer_options = choice.reducer_options.get();
  b.algorithm_options = choice.algorithm_options.get();
  auto keep = std::make_shared<ComponentChoice>(choice);
  b.choice_keepalive = keep;
}

void rebuild(DistributedOptimizer& opt, OptimizerBuild b,
             const std::function<void(std::vector<state::ShardState>&)>& amend,
             const std::string& what) {
  std::unique_ptr<Impl>& slot = Access::ptr(opt);
  Impl& old = *slot;
  // Parameter sharding: the new build reads whole parameters (their shapes,
  // and the values a sharding algorithm takes its shards from). Gathered
  // now (collective), they stay views of the old units' buffers once the
  // old optimizer is gone; a new sharding optimizer frees them.
  struct Gathered {
    std::shared_ptr<ParamShards> shards;  // not `old`: gone when the swap succeeded
    bool keep = false;                    // the new optimizer took the parameters over
    explicit Gathered(Impl& old) : shards(old.shards) {
      if (shards) shards->gather_all();
    }
    ~Gathered() {
      if (keep || !shards) return;
      shards->attach_again();  // a failed new one detached the units
      shards->release_all();
    }
  } gathered(old);
  b.initial_masters = full_masters(old);
  const int rank = old.build.common.rank, world = old.world_size;
  // Unique per instance: the old one is still alive while this is created.
  b.rebuilds = old.build.rebuilds + 1;
  b.scope = b.scope.substr(0, b.scope.find("/build-")) + "/build-" + std::to_string(b.rebuilds);

  // Failures here are local: they are agreed on before anyone throws.
  std::exception_ptr failure;
  std::unique_ptr<Impl> fresh;
  try {
    std::vector<state::ShardState> shards = exchange_state(old, rank, world);
    if (amend) amend(shards);
    fresh = build_impl(std::move(b));
    restore_into(*fresh, old, std::move(shards), rank, world);
  } catch (const ComponentError& e) {
    // Say that nothing changed; keep the status for callers that check it.
    failure = std::make_exception_ptr(
        ComponentError(e.status(), what, "rebuilding the optimizer (it is unchanged)", e.what()));
    fresh.reset();
  } catch (const std::exception&) {
    failure = std::current_exception();
    fresh.reset();
  }

  // All swap or none.
  auto ok = state::gather_i64(old.build.control, rank, world, {fresh ? 1 : 0});
  if (!fresh) std::rethrow_exception(failure);
  for (int r = 0; r < world; ++r)
    if (ok[static_cast<size_t>(r)] != 1) {
      fresh.reset();
      throw Error(what + ": rank " + std::to_string(r) +
                  " could not rebuild the optimizer; it is unchanged on every rank");
    }
  gathered.keep = true;
  slot.swap(fresh);
  fresh.reset();  // the old one: hooks off, algorithm, then reducer destroyed
}

bool attached(DistributedOptimizer& opt) { return Access::ptr(opt) != nullptr; }

OptimizerBuild detach(DistributedOptimizer& opt, uint64_t* bytes_sent) {
  std::unique_ptr<Impl>& slot = Access::ptr(opt);
  OptimizerBuild b = slot->build;
  *bytes_sent = slot->bytes_sent_base + slot->components_bytes_sent();
  // Parameter sharding: the next build needs the parameters' shapes (the
  // values come from the commit it is restored from).
  if (slot->shards) slot->shards->unshard_locally();
  slot.reset();  // hooks off, algorithm, then reducer destroyed
  return b;
}

void reattach(DistributedOptimizer& opt, OptimizerBuild b, uint64_t bytes_sent) {
  if (b.buffers) b.buffers->rebind(b, b.common.rank, b.common.world_size);
  std::unique_ptr<Impl> fresh = build_impl(std::move(b));
  fresh->bytes_sent_base = bytes_sent;
  Access::ptr(opt) = std::move(fresh);
}

}  // namespace distopt::optim
