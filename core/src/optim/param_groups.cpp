// DistributedOptimizer::add_param_group: rebuild the optimizer over the old
// parameters plus a new group, moving the old state across through the
// checkpoint machinery (every component saves its state as element ranges
// of logical per-parameter tensors, readable under any other partition).
//
// Protocol (every step collective, in this order on every rank):
//   1. agree: each rank's local checks (ok flag) and a hash of the call's
//      arguments, gathered; any failure or mismatch throws on every rank
//      before anything changed;
//   2. broadcast the new parameters from rank 0;
//   3-5. rebuild with the old state (optim/rebuild.hpp): exchange, build
//      the replacement beside the old optimizer, all swap or none.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <optional>
#include <set>

#include "base/services.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/sdk/base/fnv1a.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/component_state.hpp"
#include "optim/optimizer_builder.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"
#include "state/exchange.hpp"
#include "state/state_source.hpp"

namespace distopt {

namespace {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// "" when the call is fine on this rank, else the ConfigError message.
std::string check_arguments(const DistributedOptimizer::Impl& m, const NamedParams& named,
                            double lr, double weight_decay) {
  const std::string what = "add_param_group: ";
  if (named.empty()) return what + "no parameters";
  if (!std::isfinite(lr) || !std::isfinite(weight_decay))
    return what + "lr and weight_decay must be finite (negative = the optimizer's option)";
  std::map<std::string, int> have;  // name -> group
  for (size_t i = 0; i < m.build.params.size(); ++i)
    have[m.build.params[i].first] = m.params[i].group;
  std::set<std::string> seen;
  for (const auto& [name, t] : named) {
    if (name.empty()) return what + "a parameter has an empty name";
    if (auto it = have.find(name); it != have.end())
      return what + "parameter '" + name + "' is already in the optimizer (group " +
             std::to_string(it->second) + ")";
    if (!seen.insert(name).second) return what + "parameter '" + name + "' is named twice";
    if (!t.defined()) return what + "parameter '" + name + "' is an undefined tensor";
    if (t.is_sparse() || !t.is_contiguous())
      return what + "parameter '" + name + "' must be a dense, contiguous tensor";
  }
  return "";
}

// What every rank must pass identically.
int64_t call_hash(const NamedParams& named, double lr, double weight_decay) {
  sdk::Fnv1a h;
  for (const auto& [name, t] : named) {
    h.chars(name).value(int64_t{-1});  // separator
    if (!t.defined()) continue;
    for (int64_t d : t.sizes()) h.value(d);
    h.value(static_cast<int64_t>(t.scalar_type())).value(int64_t{t.requires_grad() ? 1 : 0});
  }
  return h.value(lr).value(weight_decay).digest_i64();
}

void broadcast_from_rank0(const optim::OptimizerBuild& b, int world, const NamedParams& named) {
  if (world <= 1) return;
  at::NoGradGuard no_grad;
  std::deque<sdk::DLView> views;
  std::vector<CommRequest> reqs;
  for (const auto& [name, t] : named) {
    if (t.numel() == 0) continue;
    views.emplace_back(t.detach());
    DLTensor* d = views.back().get();
    const dopt_comm_ref comm = optim::comm_for(b, d->device.device_type);
    dopt_request* req = nullptr;
    const std::string what = "broadcast(add_param_group parameter '" + name + "')";
    const dopt_status st = comm.vt->broadcast(comm.comm, d, 0, &req);
    if (st != DOPT_OK) throw CommError(st, "communicator", what, take_last_error());
    reqs.emplace_back(comm.vt, req, "communicator:" + what);
  }
  for (auto& r : reqs) r.wait();
}

// The state a freshly built optimizer has for parameters it never stepped,
// where that is not "nothing": libtorch's Adagrad creates step 0 and
// sum = initial_accumulator_value in its constructor, and its load refuses a
// parameter without them. Put under the shared keys (state.h), whole.
void add_fresh_state(state::ShardState& s, const DistributedOptimizer::Impl& m,
                     const NamedParams& named) {
  if (m.build.optimizer_name != "adagrad") return;
  const double init = m.build.optimizer_options->get_double("initial_accumulator_value");
  for (const auto& [name, t] : named) {
    if (!t.requires_grad()) continue;
    const std::string base = optim::kAlgorithmPrefix + "optimizer/" + name + "/";
    state::StateEntry step;
    step.key = base + "step";
    step.data = at::zeros({1}, at::kLong);
    s.add(std::move(step));
    state::StateEntry sum;
    sum.key = base + "sum";
    sum.shape.assign(t.sizes().begin(), t.sizes().end());
    // The dtype the algorithm steps in: the fp32 master under mixed precision.
    const at::ScalarType dt = m.masters && t.is_floating_point() ? at::kFloat : t.scalar_type();
    sum.data = at::full({t.numel()}, init, at::TensorOptions().dtype(dt));
    s.add(std::move(sum));
  }
}

}  // namespace

void DistributedOptimizer::add_param_group(const NamedParams& named_params, double lr,
                                           double weight_decay) {
  Impl& old = *impl_;
  const int rank = old.build.common.rank, world = old.world_size;
  const dopt_comm_ref control = old.build.control;  // host-memory agreements
  // Requests of the last backward may be in flight on the communicator: any
  // collective now could interleave with them. Local, before any collective
  // (every rank of an SPMD program is in the same state).
  if (old.launched)
    throw Error(
        "add_param_group: a backward launched gradient buckets whose reduction has not been "
        "waited for: call step() first (add_param_group goes between steps)");

  // 1. Agreement on the arguments.
  const std::string bad = check_arguments(old, named_params, lr, weight_decay);
  const int64_t hash = call_hash(named_params, lr, weight_decay);
  optim::agree_on_call(control, rank, world, bad, hash, "add_param_group",
                       "parameter names, shapes, dtypes, requires_grad or lr / weight_decay");

  // 2. Every rank starts the new parameters from rank 0's values.
  broadcast_from_rank0(old.build, world, named_params);

  // 3-5. The replacement, with the old state and the new group (rebuild.hpp).
  optim::OptimizerBuild b = old.build;
  // An implicit group 0 (no specs) becomes an explicit spec that names
  // nobody: unnamed parameters still go to group 0.
  if (b.groups.size() < old.groups.size()) b.groups.resize(old.groups.size());
  optim::GroupSpec spec;
  for (const auto& np : named_params) spec.names.push_back(np.first);
  spec.lr = lr;
  spec.weight_decay = weight_decay;
  b.groups.push_back(std::move(spec));
  b.params.insert(b.params.end(), named_params.begin(), named_params.end());
  optim::rebuild(
      *this, std::move(b),
      [&](std::vector<state::ShardState>& shards) {
        add_fresh_state(shards.at(0), old, named_params);
      },
      "add_param_group");
  log(DOPT_LOG_DEBUG, "optimizer",
      "add_param_group: " + std::to_string(named_params.size()) + " parameter(s) as group " +
          std::to_string(impl_->groups.size() - 1) + "; " +
          std::to_string(impl_->buckets->num_buckets()) +
          (impl_->buckets->num_buckets() == 1 ? " bucket" : " buckets"));
}

}  // namespace distopt
