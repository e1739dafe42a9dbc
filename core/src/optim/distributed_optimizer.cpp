// DistributedOptimizer: owns the bucket manager, the reducer and the
// algorithm instances, and the C descriptors they borrow.
#include "distopt/distributed_optimizer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <set>

#include "base/services.hpp"
#include "distopt/algorithm.h"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/reducer.h"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/base/traffic.hpp"
#include "distopt/watchdog.hpp"
#include "optim/autotune.hpp"
#include "optim/buffer_sync.hpp"
#include "optim/device_check.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/storage.hpp"

namespace distopt {

namespace optim {
namespace {

size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

/// The algorithm's ABI 1.7 answer for its options, when the model has units.
int32_t param_sharding_of(const OptimizerBuild& b) {
  const auto* avt = static_cast<const dopt_algorithm_v1*>(b.algorithm.vtable);
  if (!DOPT_HAS_FIELD(avt, dopt_algorithm_v1, scatter_params) || !avt->param_sharding ||
      !avt->gather_params || !avt->wait_params || !avt->scatter_params)
    return DOPT_PARAM_SHARDING_NONE;
  const int32_t mode = avt->param_sharding(b.algorithm_options->c_handle());
  if (mode == DOPT_PARAM_SHARDING_NONE) return mode;
  if (mode != DOPT_PARAM_SHARDING_FULL && mode != DOPT_PARAM_SHARDING_KEEP_FOR_BACKWARD)
    throw ComponentError(DOPT_ERR_INTERNAL, b.algorithm.plugin_name + "/" + b.algorithm.name,
                         "param_sharding", "unknown mode " + std::to_string(mode));
  if (b.unit_slots.empty()) {
    if (b.common.rank == 0 && b.common.world_size > 1)
      log(DOPT_LOG_WARN, "optimizer",
          "algorithm '" + b.algorithm.name +
              "' shards the parameters of units, but the model has no distopt::ShardedUnit "
              "(distopt/sharded_unit.hpp): every parameter stays whole on every rank");
    return DOPT_PARAM_SHARDING_NONE;
  }
  return mode;
}

/// After the algorithm's create: the units' parameters are the algorithm's
/// shards now; free the full copies and the units' gradient buckets.
void start_sharding(DistributedOptimizer::Impl& m, int32_t mode,
                    const std::vector<sdk::DLView*>& data_views) {
  const OptimizerBuild& b = m.build;
  const dopt_bucket* descs = m.buckets->buckets();
  std::vector<ParamShards::UnitSpec> specs;
  std::vector<std::shared_ptr<UnitSlot>> slots;
  m.shard_of_bucket.assign(m.buckets->num_buckets(), -1);
  for (size_t k = 0; k < m.buckets->num_buckets(); ++k) {
    const int unit = m.buckets->unit_of_bucket(k);
    if (unit < 0) continue;
    ParamShards::UnitSpec spec;
    spec.name = b.unit_names.at(static_cast<size_t>(unit));
    spec.bucket = &m.algorithm_buckets()[k];  // the fp32 masters' under mixed precision
    for (size_t e = 0; e < descs[k].num_entries; ++e) {
      const dopt_bucket_entry& en = descs[k].entries[e];
      const auto pi = static_cast<size_t>(en.param_index);
      spec.members.push_back({pi, b.params[pi].second, en.offset, {}});
      // The descriptor's tensor kept the whole parameter (or its fp32
      // master) alive; it is not valid after create (algorithm.h).
      *data_views[pi] = sdk::DLView(at::empty({0}, b.params[pi].second.options()));
      if (m.masters) m.masters->drop_master(pi);  // the algorithm's shards are the masters
    }
    spec.numel = round_up(static_cast<size_t>(m.buckets->flat(k).numel()),
                          static_cast<size_t>(m.world_size));
    m.shard_of_bucket[k] = static_cast<int>(specs.size());
    specs.push_back(std::move(spec));
    slots.push_back(b.unit_slots.at(static_cast<size_t>(unit)));
  }
  // Freed full buffers and gradient buckets are reused within a step: at
  // most two units' parameters (running, prefetched) and two units' gradient
  // buckets (being filled, being reduced) are in use at once.
  auto pool = std::make_shared<StoragePool>(4);
  m.shards = std::make_shared<ParamShards>(std::move(specs), mode, m.avt, m.algorithm,
                                           m.algorithm_who, pool);
  m.shards->attach(std::move(slots));
  m.shards->free_all();
  m.buckets->release_unit_grads();
  m.buckets->set_storage_pool(pool);
  if (m.masters) {
    std::vector<bool> sharded(m.buckets->num_buckets());
    for (size_t k = 0; k < sharded.size(); ++k) sharded[k] = m.shard_of_bucket[k] >= 0;
    m.masters->shard_buckets(sharded, pool);
  }
  // Per parameter: its unit among the shards and its place there.
  std::vector<std::pair<int, size_t>> member_of(b.params.size(), {-1, 0});
  for (size_t k = 0; k < m.buckets->num_buckets(); ++k) {
    if (m.shard_of_bucket[k] < 0) continue;
    for (size_t e = 0; e < descs[k].num_entries; ++e)
      member_of[static_cast<size_t>(descs[k].entries[e].param_index)] = {m.shard_of_bucket[k], e};
  }
  std::weak_ptr<ParamShards> weak = m.shards;
  DistributedOptimizer::Impl* raw = &m;  // owns the bucket manager: outlives its hooks
  m.buckets->on_unit_grad([weak, member_of, raw](size_t i) {
    raw->note_unit_grads();
    auto shards = weak.lock();
    if (shards && member_of[i].first >= 0)
      shards->grad_ready(member_of[i].first, member_of[i].second);
  });
  m.buckets->on_unit_bucket_alloc([raw](size_t handed) { raw->finish_handed_units(handed); });
}

}  // namespace

std::unique_ptr<DistributedOptimizer::Impl> build_impl(OptimizerBuild build) {
  auto impl = std::make_unique<DistributedOptimizer::Impl>();
  auto& m = *impl;
  m.build = std::move(build);
  auto& b = m.build;
  m.world_size = b.common.world_size;
  m.reducer_who = b.reducer.plugin_name + "/" + b.reducer.name;
  m.algorithm_who = b.algorithm.plugin_name + "/" + b.algorithm.name;
  // Quoted by the watchdog as "algorithm '<this>'": the reducer runs inside its calls.
  m.watched_as = b.algorithm.name + "' with reducer '" + b.reducer.name;
  check_param_devices(b);  // ABI 1.4: before any hook or instance exists

  // Parameter groups: spec k is group k; parameters no spec names go to group 0.
  std::map<std::string, int> group_of;
  for (size_t g = 0; g < b.groups.size(); ++g)
    for (const auto& n : b.groups[g].names) {
      if (!group_of.emplace(n, static_cast<int>(g)).second)
        throw ConfigError("parameter '" + n + "' is named in two parameter groups");
    }
  std::set<std::string> seen;
  for (const auto& [name, t] : b.params) {
    if (!seen.insert(name).second) throw ConfigError("duplicate parameter name '" + name + "'");
  }
  for (const auto& [n, g] : group_of)
    if (!seen.count(n))
      throw ConfigError("parameter group " + std::to_string(g) + " names unknown parameter '" + n +
                        "'");
  size_t num_groups = std::max<size_t>(1, b.groups.size());
  m.groups.resize(num_groups);
  for (size_t g = 0; g < num_groups; ++g) {
    dopt_param_group& d = m.groups[g];
    d.struct_size = DOPT_PARAM_GROUP_STRUCT_SIZE;
    d.lr = g < b.groups.size() ? b.groups[g].lr : -1;
    d.weight_decay = g < b.groups.size() ? b.groups[g].weight_decay : -1;
  }

  // Buckets (gradients become views into them; hooks launch through the algorithm).
  optim::BucketOptions bo;
  bo.cap_bytes = b.reducer_options->get_double("bucket_cap_mb") * 1024.0 * 1024.0;
  bo.align_bytes = static_cast<size_t>(b.reducer_options->get_int("align_bytes"));
  bo.overlap = b.reducer_options->get_bool("overlap");
  DistributedOptimizer::Impl* raw = impl.get();
  const bool mixed = b.precision.enabled();
  const int32_t sharding = param_sharding_of(b);
  if (sharding != DOPT_PARAM_SHARDING_NONE) {
    const std::string where = b.job_path.empty() ? "" : b.job_path + ": ";
    // Mixed precision: the units' gradients go to the algorithm during
    // backward, before the inf/NaN check, so it must be able to drop a step.
    const auto* avt = static_cast<const dopt_algorithm_v1*>(b.algorithm.vtable);
    if (mixed && !(DOPT_HAS_FIELD(avt, dopt_algorithm_v1, discard_step) && avt->discard_step))
      throw ConfigError(where + "precision: algorithm '" + b.algorithm.name + "' (plugin " +
                        b.algorithm.file +
                        ") shards parameters but cannot run them in mixed precision: it was "
                        "built without discard_step (ABI 1.8, algorithm.h); use precision: "
                        "{dtype: fp32}, or an algorithm that does not shard parameters");
    // A joined rank would have to take part in every unit's gather of the
    // ranks still training (forward and backward), which join() does not.
    if (b.join.enabled)
      throw ConfigError(where + "join.enabled: algorithm '" + b.algorithm.name +
                        "' shards parameters (zero stage 3): a rank that ran out of data "
                        "cannot shadow the others' gathers of every unit; use join: {enabled: "
                        "false} with equal inputs, or zero stage 2");
    bo.units = b.param_units;
    if (b.common.rank == 0)
      for (const auto& note : b.unit_notes) log(DOPT_LOG_INFO, "optimizer", note);
  }
  if (mixed) bo.plan_element_size = 4;  // fp32 master buckets get an fp32 model's layout
  // Mixed precision launches nothing from the hooks: the fp32 buckets go to
  // the algorithm in step(), once every rank's gradients are known finite.
  // With parameter sharding no rank may hold all gradients until then: each
  // bucket goes unscaled as soon as it is complete, and a step with an
  // inf/NaN is discarded (ABI 1.8; FSDP with ShardedGradScaler does the same).
  optim::BucketManager::LaunchFn launch_fn = [raw](const dopt_bucket& bucket) {
    raw->launch(bucket);
  };
  if (mixed && sharding != DOPT_PARAM_SHARDING_NONE)
    launch_fn = [raw](const dopt_bucket& bucket) { raw->launch_unscaled(bucket); };
  else if (mixed)
    launch_fn = [](const dopt_bucket&) {};
  m.buckets = std::make_unique<optim::BucketManager>(b.params, bo, std::move(launch_fn));
  if (mixed) {
    m.masters =
        std::make_unique<optim::MasterWeights>(b.params, *m.buckets, b.initial_masters.get());
    b.initial_masters.reset();  // the masters hold them now
    m.scaler = std::make_unique<LossScaler>(b.precision);
  }
  for (size_t k = 0; k < m.buckets->num_buckets(); ++k)
    m.plain_bytes_per_step += sdk::ring_allreduce_bytes(m.algorithm_bucket_bytes(k), m.world_size);

  m.params.resize(b.params.size());
  std::vector<sdk::DLView*> data_views(b.params.size(), nullptr);
  for (size_t i = 0; i < b.params.size(); ++i) {
    const auto& [name, t] = b.params[i];
    dopt_param& d = m.params[i];
    d.struct_size = DOPT_PARAM_STRUCT_SIZE;
    d.name = name.c_str();
    if (!t.is_contiguous()) throw Error("parameter '" + name + "' must be contiguous");
    m.views.emplace_back(m.masters ? m.masters->master(i) : t.detach());
    d.data = m.views.back().get();
    data_views[i] = &m.views.back();
    const at::Tensor& g = m.masters ? m.masters->master_grad(i) : m.buckets->grad_view(i);
    if (g.defined()) {
      m.views.emplace_back(g);
      d.grad = m.views.back().get();
    }
    d.requires_grad = g.defined() ? 1 : 0;
    auto it = group_of.find(name);
    d.group = it == group_of.end() ? 0 : it->second;
  }

  // Reducer, then algorithm.
  m.reducer_scope = b.scope + "/reducer";
  m.algorithm_scope = b.scope + "/algorithm";
  m.reducer_args = b.common;
  m.reducer_args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  m.reducer_args.options = b.reducer_options->c_handle();
  m.reducer_args.scope = m.reducer_scope.c_str();
  m.rvt = static_cast<const dopt_reducer_v1*>(b.reducer.vtable);
  take_last_error();
  check_status(m.rvt->create(&m.reducer_args, b.comm, m.algorithm_buckets(),
                             m.buckets->num_buckets(), &m.reducer),
               m.reducer_who, "create");

  m.algorithm_common = b.common;
  m.algorithm_common.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  m.algorithm_common.options = b.algorithm_options->c_handle();
  m.algorithm_common.scope = m.algorithm_scope.c_str();
  dopt_algorithm_args& a = m.algorithm_args;
  a.struct_size = DOPT_ALGORITHM_ARGS_STRUCT_SIZE;
  a.common = &m.algorithm_common;
  a.comm = b.comm;
  a.reducer = {m.rvt, m.reducer};
  a.params = m.params.data();
  a.num_params = m.params.size();
  a.groups = m.groups.data();
  a.num_groups = m.groups.size();
  a.buckets = m.algorithm_buckets();
  a.num_buckets = m.buckets->num_buckets();
  a.optimizer_name = b.optimizer_name.c_str();
  a.optimizer_options = b.optimizer_options->c_handle();
  a.struct_size = DOPT_ALGORITHM_ARGS_V1_7_STRUCT_SIZE;
  if (sharding != DOPT_PARAM_SHARDING_NONE) {
    for (size_t k = 0; k < m.buckets->num_buckets(); ++k)
      m.bucket_sharded.push_back(m.buckets->unit_of_bucket(k) >= 0 ? 1 : 0);
    a.bucket_sharded = m.bucket_sharded.data();
  }
  m.avt = static_cast<const dopt_algorithm_v1*>(b.algorithm.vtable);
  check_status(m.avt->create(&a, &m.algorithm), m.algorithm_who, "create");
  m.apply_grad_clip();
  if (sharding != DOPT_PARAM_SHARDING_NONE) start_sharding(m, sharding, data_views);
  return impl;
}

DistributedOptimizer build_optimizer(OptimizerBuild build) {
  return DistributedOptimizer(build_impl(std::move(build)));
}

}  // namespace optim

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DistributedOptimizer::DistributedOptimizer(DistributedOptimizer&&) noexcept = default;
DistributedOptimizer& DistributedOptimizer::operator=(DistributedOptimizer&&) noexcept = default;
DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::zero_grad() { impl_->buckets->zero_grad(); }

DistributedOptimizer::NoSync::NoSync(DistributedOptimizer& opt) : opt_(&opt) {
  if (opt.impl_->buckets->no_sync())
    throw Error("no_sync(): already inside a no_sync() scope (scopes do not nest)");
  opt.impl_->buckets->set_no_sync(true);
}

DistributedOptimizer::NoSync::~NoSync() { opt_->impl_->buckets->set_no_sync(false); }

float DistributedOptimizer::Impl::allreduce_scalar(float value, dopt_reduce_op op,
                                                   const char* what) {
  allreduce_floats(&value, 1, op, what);
  return value;
}

void DistributedOptimizer::Impl::allreduce_floats(float* values, int64_t n, dopt_reduce_op op,
                                                  const char* what) {
  if (n <= 0) return;
  int64_t shape = n;
  DLTensor t = make_dltensor(values, n, DLDataType{kDLFloat, 32, 1}, &shape);
  const dopt_comm_ref& c = build.control;  // host memory
  dopt_request* req = nullptr;
  const std::string op_name = std::string("allreduce(") + what + ")";
  dopt_status st = c.vt->allreduce(c.comm, &t, &t, op, &req);
  if (st != DOPT_OK) throw CommError(st, "communicator", op_name, take_last_error());
  CommRequest(c.vt, req, "communicator:" + op_name).wait();
}

bool DistributedOptimizer::Impl::any_rank_found_inf(bool mine) {
  if (world_size <= 1) return mine;
  return allreduce_scalar(mine ? 1.0f : 0.0f, DOPT_REDUCE_MAX,
                          "mixed-precision inf/NaN flag, MAX") != 0.0f;
}

int DistributedOptimizer::Impl::count_ranks_not_joined(bool mine) {
  const float n =
      allreduce_scalar(mine ? 1.0f : 0.0f, DOPT_REDUCE_SUM, "join: ranks not joined, SUM");
  return static_cast<int>(n + 0.5f);
}

void DistributedOptimizer::Impl::ensure_join_notified() {
  if (join_notified || !build.join.enabled || world_size <= 1) return;
  join_notified = true;
  const int active = count_ranks_not_joined(!joined);
  grad_scale = 1;
  if (!joined && active < world_size && !build.join.divide_by_initial_world_size)
    grad_scale = static_cast<double>(world_size) / active;
}

void DistributedOptimizer::Impl::launch(const dopt_bucket& bucket) {
  launched = true;
  ensure_join_notified();
  if (grad_scale != 1) sdk::as_tensor(*bucket.flat).mul_(grad_scale);
  const WatchdogScope watched("algorithm", watched_as, "on_bucket_ready of bucket", bucket.index);
  check_status(avt->on_bucket_ready(algorithm, &bucket), algorithm_who,
               "on_bucket_ready(bucket " + std::to_string(bucket.index) + ")");
  // Parameter sharding: the algorithm is done with the units handed before
  // this one (algorithm.h); their full gradients go.
  if (shards)
    for (int k = 0; k < bucket.index; ++k) release_unit_bucket(static_cast<size_t>(k));
}

void DistributedOptimizer::Impl::release_unit_bucket(size_t k) {
  if (shard_of_bucket[k] < 0) return;
  buckets->release_unit_grad(k);
  if (masters) masters->release_bucket(k);
}

void DistributedOptimizer::Impl::finish_handed_units(size_t handed) {
  if (!DOPT_HAS_FIELD(avt, dopt_algorithm_v1, finish_buckets) || !avt->finish_buckets) return;
  int32_t finished = 0;
  {
    const WatchdogScope watched("algorithm", watched_as, "finish_buckets");
    check_status(avt->finish_buckets(algorithm, &finished), algorithm_who, "finish_buckets");
  }
  if (finished)
    for (size_t k = 0; k < handed; ++k) release_unit_bucket(k);
}

uint64_t DistributedOptimizer::Impl::unit_grad_bytes() const {
  uint64_t n = 0;
  for (size_t k = 0; k < shard_of_bucket.size(); ++k) {
    if (shard_of_bucket[k] < 0) continue;
    n += optim::storage_bytes(buckets->flat(k));
    if (masters && !masters->aliases_model_bucket(k)) n += optim::storage_bytes(masters->flat(k));
  }
  return n;
}

void DistributedOptimizer::Impl::note_unit_grads() {
  const uint64_t now = unit_grad_bytes();
  uint64_t peak = peak_unit_grads.load();
  while (now > peak && !peak_unit_grads.compare_exchange_weak(peak, now)) {
  }
}

void DistributedOptimizer::Impl::end_sharded_step() {
  buckets->release_unit_grads();
  for (size_t k = 0; k < shard_of_bucket.size(); ++k) release_unit_bucket(k);
  shards->end_step();
}

void DistributedOptimizer::Impl::launch_unscaled(const dopt_bucket& bucket) {
  const auto k = static_cast<size_t>(bucket.index);
  masters->unscale_bucket(k, scaler->scale());
  if (shard_of_bucket[k] >= 0) note_unit_grads();  // the unit's bf16 and fp32 gradients
  // The fp32 copy is what the algorithm reads: the unit's low-precision
  // gradients can go now.
  if (shard_of_bucket[k] >= 0 && !masters->aliases_model_bucket(k)) buckets->release_unit_grad(k);
  launch(masters->buckets()[k]);
}

void DistributedOptimizer::Impl::mixed_precision_step() {
  // Completes the low-precision buckets: launches nothing, or (parameter
  // sharding) hands the rest to the algorithm unscaled.
  buckets->finish();
  ensure_join_notified();  // before the inf/NaN flag: the order joined ranks shadow
  const bool local_inf =
      shards ? masters->take_found_inf() : masters->unscale_grads(scaler->scale());
  if (any_rank_found_inf(local_inf)) {
    if (shards) {
      {
        const WatchdogScope watched("algorithm", watched_as, "discard_step");
        check_status(avt->discard_step(algorithm), algorithm_who, "discard_step");
      }
      end_sharded_step();
    }
    scaler->update(/*found_inf=*/true);
    metric_add("optim.skipped_steps", 1);
    log(DOPT_LOG_DEBUG, "optimizer",
        std::string("step skipped: inf/NaN gradient on ") +
            (local_inf ? "this rank" : "another rank") + "; loss scale now " +
            std::to_string(scaler->scale()));
    return;
  }
  if (!shards) {
    const dopt_bucket* descs = masters->buckets();
    for (size_t b = 0; b < masters->num_buckets(); ++b) launch(descs[b]);
  }
  {
    const WatchdogScope watched("algorithm", watched_as, "step");
    check_status(avt->step(algorithm), algorithm_who, "step");
  }
  if (shards) end_sharded_step();
  masters->copy_to_model();
  scaler->update(/*found_inf=*/false);
  ++steps;
}

double DistributedOptimizer::Impl::base_lr(size_t g) const {
  if (g < lr_set.size() && lr_set[g] >= 0) return lr_set[g];
  if (g < groups.size() && groups[g].lr >= 0) return groups[g].lr;
  return build.optimizer_options->get_double("lr");
}

void DistributedOptimizer::Impl::apply_lr_schedule() {
  if (!build.lr_schedule) return;
  const double f = build.lr_schedule->factor(steps);
  for (size_t g = 0; g < groups.size(); ++g)
    check_status(avt->set_lr(algorithm, static_cast<int32_t>(g), base_lr(g) * f), algorithm_who,
                 "set_lr(group " + std::to_string(g) + ") for the lr_schedule");
  metric_add("optimizer.lr", base_lr(0) * f);
  metric_add("optimizer.lr_steps", 1);
}

void DistributedOptimizer::Impl::apply_grad_clip() {
  if (build.grad_clip <= 0) return;
  if (!DOPT_HAS_FIELD(avt, dopt_algorithm_v1, set_grad_clip) || !avt->set_grad_clip)
    throw ConfigError("optimizer.grad_clip: algorithm '" + build.algorithm.name + "' (plugin " +
                      build.algorithm.file +
                      ") cannot clip gradients: it was built for ABI < 1.5, without "
                      "set_grad_clip (algorithm.h)");
  check_status(avt->set_grad_clip(algorithm, build.grad_clip), algorithm_who,
               "set_grad_clip(" + std::to_string(build.grad_clip) + ")");
}

namespace {

void one_step(DistributedOptimizer::Impl& m) {
  // Whatever happens below, nothing of this backward is in flight afterwards
  // (the algorithm waits for every bucket or drops its requests on error).
  struct Done {
    DistributedOptimizer::Impl& m;
    ~Done() {
      m.launched = false;
      m.join_notified = false;
      m.grad_scale = 1;
    }
  } done{m};
  auto t0 = std::chrono::steady_clock::now();
  m.apply_lr_schedule();  // steps() is this step's index (a skipped step reapplies it)
  if (m.masters) {
    const int64_t before = m.steps;
    m.mixed_precision_step();
    metric_add("optim.step_seconds",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    m.sync_buffers();               // the forward changed them even if the step was skipped
    if (m.steps == before) return;  // skipped: nothing was sent
    m.check_reducer_used();
    metric_add("optim.steps", 1);
    metric_add("optim.bytes_plain_allreduce", static_cast<double>(m.plain_bytes_per_step));
    return;
  }
  m.buckets->finish();
  m.ensure_join_notified();  // a step that launched no bucket still counts
  // A parameter whose .data user code replaced (set_data, same size and
  // dtype) now lives elsewhere: re-point its descriptor so algorithms that
  // check (fused's check_flatten) update the memory the model uses.
  for (size_t i = 0; i < m.params.size(); ++i) {
    const at::Tensor& t = m.build.params[i].second;
    DLTensor* d = m.params[i].data;
    if (t.data_ptr() != static_cast<char*>(d->data) + d->byte_offset && t.is_contiguous() &&
        t.numel() == sdk::as_tensor(*d).numel() &&
        t.scalar_type() == sdk::as_tensor(*d).scalar_type()) {
      d->data = t.data_ptr();
      d->byte_offset = 0;
    }
  }
  {
    const WatchdogScope watched("algorithm", m.watched_as, "step");
    check_status(m.avt->step(m.algorithm), m.algorithm_who, "step");
  }
  if (m.shards) m.end_sharded_step();
  ++m.steps;
  m.sync_buffers();
  m.check_reducer_used();
  metric_add("optim.steps", 1);
  metric_add("optim.step_seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  metric_add("optim.bytes_plain_allreduce", static_cast<double>(m.plain_bytes_per_step));
}

}  // namespace

void DistributedOptimizer::step() {
  one_step(*impl_);
  if (!impl_->build.schedule.empty()) optim::advance_schedule(*this);
  if (impl_->build.tuner && !impl_->build.tuner->done()) impl_->build.tuner->after_step(*this);
}

std::vector<std::pair<double, double>> DistributedOptimizer::autotune_table() const {
  std::vector<std::pair<double, double>> t;
  for (const AutotuneRow& r : autotune_rows()) t.emplace_back(r.setting.bucket_cap_mb, r.seconds);
  return t;
}

std::vector<AutotuneRow> DistributedOptimizer::autotune_rows() const {
  return impl_->build.tuner ? impl_->build.tuner->table() : std::vector<AutotuneRow>{};
}

double DistributedOptimizer::autotuned_bucket_cap_mb() const {
  const auto s = autotuned_setting();
  return s ? s->bucket_cap_mb : -1;
}

std::optional<AutotuneSetting> DistributedOptimizer::autotuned_setting() const {
  const auto& t = impl_->build.tuner;
  if (t && t->done()) return t->chosen();
  return std::nullopt;
}

int64_t DistributedOptimizer::join() {
  auto& m = *impl_;
  if (m.world_size <= 1) return 0;
  if (!m.build.join.enabled)
    throw ConfigError(
        "join(): the job has join.enabled: false (the default), so the ranks still stepping "
        "do not count joined ranks; set join: {enabled: true} in the job of every rank");
  if (m.launched)
    throw Error(
        "join(): a backward launched gradient buckets whose step() has not run; call "
        "step() first");
  struct Joined {
    bool& joined;
    ~Joined() { joined = false; }
  } guard{m.joined};
  m.joined = true;
  int64_t shadowed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const int active = m.count_ranks_not_joined(false);
    if (active == 0) break;  // every rank has joined: all leave together
    m.join_notified = true;
    zero_grad();
    step();  // the others' step, with zero gradients
    ++shadowed;
  }
  metric_add("optim.join_shadow_steps", static_cast<double>(shadowed));
  metric_add("optim.join_seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (shadowed > 0)
    log(DOPT_LOG_DEBUG, "optimizer",
        "rank " + std::to_string(m.build.common.rank) + " joined and shadowed " +
            std::to_string(shadowed) + " step(s) of the other ranks");
  return shadowed;
}

void DistributedOptimizer::set_lr(double lr, int group) {
  check_status(impl_->avt->set_lr(impl_->algorithm, group, lr), impl_->algorithm_who,
               "set_lr(group " + std::to_string(group) + ")");
  auto& set = impl_->lr_set;
  if (group >= 0 && static_cast<size_t>(group) < impl_->groups.size()) {
    if (set.size() < impl_->groups.size()) set.resize(impl_->groups.size(), -1.0);
    set[static_cast<size_t>(group)] = lr;
  }
}

void DistributedOptimizer::set_lr_schedule(const LrSchedule& schedule) {
  schedule.validate();
  impl_->build.lr_schedule = schedule;
}

const std::optional<LrSchedule>& DistributedOptimizer::lr_schedule() const {
  return impl_->build.lr_schedule;
}

double DistributedOptimizer::lr(int group) const {
  const auto& m = *impl_;
  if (group < 0 || static_cast<size_t>(group) >= m.groups.size())
    throw ConfigError("lr(group " + std::to_string(group) + "): the optimizer has " +
                      std::to_string(m.groups.size()) + " parameter group(s)");
  const double base = m.base_lr(static_cast<size_t>(group));
  return m.build.lr_schedule ? base * m.build.lr_schedule->factor(m.steps) : base;
}

uint64_t DistributedOptimizer::state_bytes() const {
  return impl_->avt->state_bytes(impl_->algorithm);
}
uint64_t DistributedOptimizer::bytes_sent() const {
  return impl_->bytes_sent_base + impl_->components_bytes_sent();
}
uint64_t DistributedOptimizer::bytes_sent_plain_allreduce() const {
  // Steps before an add_param_group are counted with the buckets of then.
  const int64_t since = std::max<int64_t>(0, impl_->steps - impl_->plain_steps_base);
  return impl_->plain_bytes_base + impl_->plain_bytes_per_step * static_cast<uint64_t>(since);
}
size_t DistributedOptimizer::num_buckets() const { return impl_->buckets->num_buckets(); }
int DistributedOptimizer::num_param_groups() const {
  return static_cast<int>(impl_->groups.size());
}
int64_t DistributedOptimizer::steps() const { return impl_->steps; }

void DistributedOptimizer::set_buffers(
    const std::vector<std::pair<std::string, at::Tensor>>& named_buffers, BufferSync mode) {
  auto& m = *impl_;
  m.build.buffers = std::make_shared<optim::BufferSynchronizer>(
      named_buffers, mode, m.build, m.build.common.rank, m.build.common.world_size);
}

BufferSync DistributedOptimizer::buffer_sync() const {
  return impl_->build.buffers ? impl_->build.buffers->mode() : BufferSync::none;
}

void DistributedOptimizer::Impl::check_reducer_used() {
  if (reducer_use_checked) return;
  reducer_use_checked = true;
  if (world_size <= 1 || build.common.rank != 0 || rvt->bytes_sent(reducer) > 0) return;
  // A reducer that declares an exact mean (ABI 1.2 traits) computes what the
  // algorithm's own averaging computes: nothing was lost. A compressing
  // reducer was refused at check time by an algorithm that can see the job
  // (zero's check_job); this warning remains for those that cannot (1.0/1.1).
  if (build.reducer.traits & DOPT_TRAIT_EXACT_MEAN) return;
  log(DOPT_LOG_WARN, "optimizer",
      "algorithm " + algorithm_who + " reduced the gradients without reducer " + reducer_who +
          " (it sent nothing in the first step): the reducer's compression or scaling does not "
          "apply to this job, and the bytes reported are what the algorithm sent");
}

void DistributedOptimizer::Impl::sync_buffers() {
  if (!build.buffers || build.buffers->payload_bytes() == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  build.buffers->sync();
  metric_add("optim.buffer_sync_seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  metric_add("optim.buffer_sync_bytes", static_cast<double>(build.buffers->payload_bytes()));
}
const std::string& DistributedOptimizer::algorithm_name() const {
  return impl_->build.algorithm.name;
}
const std::string& DistributedOptimizer::reducer_name() const { return impl_->build.reducer.name; }

bool DistributedOptimizer::shards_parameters() const { return impl_->shards != nullptr; }

DistributedOptimizer::GatheredParams::GatheredParams(DistributedOptimizer& opt) : opt_(&opt) {
  if (opt.impl_->shards) opt.impl_->shards->gather_all();
}

DistributedOptimizer::GatheredParams::~GatheredParams() {
  if (opt_->impl_ && opt_->impl_->shards) opt_->impl_->shards->release_all();
}

DistributedOptimizer::ShardingMemory DistributedOptimizer::sharding_memory() {
  ShardingMemory s;
  if (!impl_->shards) return s;
  s.units = impl_->shards->num_units();
  s.gathered = impl_->shards->gathered_bytes();
  s.peak_gathered = impl_->shards->take_peak_gathered_bytes();
  s.cached = impl_->shards->cached_bytes();
  s.unit_grads = impl_->unit_grad_bytes();
  s.peak_unit_grads = std::max(s.unit_grads, impl_->peak_unit_grads.exchange(0));
  return s;
}

bool DistributedOptimizer::mixed_precision() const { return impl_->masters != nullptr; }
PrecisionDtype DistributedOptimizer::compute_dtype() const { return impl_->build.precision.dtype; }
at::Tensor DistributedOptimizer::scale_loss(const at::Tensor& loss) const {
  if (!impl_->scaler) return loss;
  return loss * impl_->scaler->scale();
}
double DistributedOptimizer::loss_scale() const {
  return impl_->scaler ? impl_->scaler->scale() : 1.0;
}
int64_t DistributedOptimizer::skipped_steps() const {
  return impl_->scaler ? impl_->scaler->skipped_steps() : 0;
}
LossScaleState DistributedOptimizer::loss_scale_state() const {
  return impl_->scaler ? impl_->scaler->state() : LossScaleState{};
}
void DistributedOptimizer::set_loss_scale_state(const LossScaleState& s) {
  if (!impl_->scaler)
    throw Error("set_loss_scale_state: mixed precision is off (no precision: section)");
  impl_->scaler->set_state(s);
}

}  // namespace distopt
