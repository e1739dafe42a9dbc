#include "optim/snapshot.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <variant>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "optim/autotune.hpp"
#include "optim/component_state.hpp"
#include "optim/optimizer_impl.hpp"

namespace distopt::optim {

using checkpoint::ComponentRecord;
using checkpoint::Manifest;
using state::ShardState;
using state::StateEntry;
using state::StateSource;

namespace {

const std::string kModel = "model/";
const std::string kMaster = "master/";

std::vector<std::pair<std::string, at::Tensor>> model_tensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

std::map<std::string, std::string> as_text(const Options* o) {
  std::map<std::string, std::string> out;
  if (!o) return out;
  for (const auto& [k, v] : o->values())
    out[k] = std::visit(
        [](const auto& x) -> std::string {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            return x;
          } else if constexpr (std::is_same_v<T, bool>) {
            return x ? "true" : "false";
          } else if constexpr (std::is_same_v<T, double>) {
            // Shortest text that reads back to the same double (eps 1e-8 is
            // "1e-08", not std::to_string's "0.000000").
            char buf[32];
            for (int digits = 6; digits <= 17; ++digits) {
              std::snprintf(buf, sizeof buf, "%.*g", digits, x);
              if (std::strtod(buf, nullptr) == x) break;
            }
            return buf;
          } else {
            return std::to_string(x);
          }
        },
        v);
  return out;
}

ComponentRecord record(const ComponentInfo& c, const Options* o) {
  ComponentRecord r;
  r.plugin = c.plugin_name;
  r.component = c.name;
  r.version = c.version;
  r.plugin_version = c.plugin_version;
  r.abi_major = c.abi_major;
  r.abi_minor = c.abi_minor;
  r.options = as_text(o);
  return r;
}

// Parameter sharding: the model tensors that are units' parameters (by
// TensorImpl: a tied parameter has several names), with their names and
// full shapes. Empty without sharding.
struct UnitTensor {
  size_t unit = 0;
  const ParamShards::Member* member = nullptr;
  std::vector<std::string> names;  // every name the model lists it under
};
using UnitTensors = std::map<const c10::TensorImpl*, UnitTensor>;

UnitTensors unit_tensors(torch::nn::Module& model, DistributedOptimizer::Impl& m) {
  UnitTensors out;
  if (!m.shards) return out;
  for (size_t u = 0; u < m.shards->num_units(); ++u)
    for (const auto& mb : m.shards->unit(u).members)
      out[mb.tensor.unsafeGetTensorImpl()] = UnitTensor{u, &mb, {}};
  for (const auto& [name, t] : model_tensors(model)) {
    auto it = out.find(t.unsafeGetTensorImpl());
    if (it != out.end()) it->second.names.push_back(name);
  }
  return out;
}

// This rank's pieces of the units' parameters (and, under mixed precision,
// of their fp32 masters): each unit is gathered alone (collective), and
// rank r keeps elements [r x n / W, (r + 1) x n / W) of its layout, so no
// rank holds the whole model and an elastic commit sends a buddy 1/W.
void put_unit_shards(DistributedOptimizer::Impl& m, const UnitTensors& units, int rank,
                     ShardState& s) {
  std::vector<std::vector<const UnitTensor*>> of_unit(m.shards->num_units());
  for (const auto& [impl, ut] : units) of_unit[ut.unit].push_back(&ut);
  const auto world = static_cast<size_t>(m.world_size);
  for (size_t u = 0; u < m.shards->num_units(); ++u) {
    const auto& spec = m.shards->unit(u);
    const size_t per_rank = spec.numel / world;
    const size_t lo = per_rank * static_cast<size_t>(rank), hi = lo + per_rank;
    auto put_pieces = [&](const at::Tensor& full, const std::string& prefix, bool masters) {
      for (const UnitTensor* ut : of_unit[u]) {
        const auto& mb = *ut->member;
        const auto numel = static_cast<size_t>(c10::multiply_integers(mb.shape));
        const size_t a = std::max(lo, mb.offset), b = std::min(hi, mb.offset + numel);
        if (a >= b) continue;
        const std::vector<std::string> build_name{m.build.params[mb.param].first};
        for (const std::string& name : masters ? build_name : ut->names) {
          StateEntry e;
          e.key = prefix + name;
          e.offset = static_cast<int64_t>(a - mb.offset);
          e.shape = mb.shape;
          e.data = full.narrow(0, static_cast<int64_t>(a), static_cast<int64_t>(b - a))
                       .to(at::kCPU)
                       .clone();
          s.add(std::move(e));
        }
      }
    };
    put_pieces(m.shards->gather_copy(u, spec.members.at(0).tensor.scalar_type()), kModel, false);
    if (m.masters) put_pieces(m.shards->gather_copy(u, at::kFloat), kMaster, true);
  }
}

// Set the algorithm's shards of every unit from `src`, one unit at a time
// (local): under mixed precision from the saved fp32 masters (or, saved
// without, the saved model's values), else from the saved model.
void restore_unit_shards(DistributedOptimizer::Impl& m, const StateSource& src) {
  for (size_t u = 0; u < m.shards->num_units(); ++u) {
    const auto& spec = m.shards->unit(u);
    const at::Tensor& first = spec.members.at(0).tensor;
    at::Tensor full =
        at::zeros({static_cast<int64_t>(spec.numel)},
                  first.options().dtype(m.masters ? at::kFloat : first.scalar_type()));
    for (const auto& mb : spec.members) {
      const std::string& name = m.build.params[mb.param].first;
      const std::string key = m.masters && src.has(kMaster + name) ? kMaster + name : kModel + name;
      full.narrow(0, static_cast<int64_t>(mb.offset), c10::multiply_integers(mb.shape))
          .copy_(src.whole(key).reshape({-1}));
    }
    m.shards->scatter_copy(u, full);
  }
}

}  // namespace

ShardState snapshot(torch::nn::Module& model, DistributedOptimizer& opt, int rank,
                    bool keep_replicas) {
  auto& m = Access::of(opt);
  require_state_api(m);
  const UnitTensors units = unit_tensors(model, m);
  at::NoGradGuard no_grad;
  ShardState s;
  s.keep_replicas(keep_replicas, rank);
  // Local replicas (decentralized): the model saved is their mean, which
  // every rank must help compute; each replica is in its algorithm state.
  std::map<std::string, at::Tensor> mean;
  if (opt.replicas_differ())
    for (auto& [name, t] : opt.average_replicas().params) mean.emplace(name, t);
  // The model and the masters are the same on every rank (the mean above
  // included): replicated state.
  if (rank == 0 || keep_replicas) {
    auto put = [&](const std::string& key, const at::Tensor& t) {
      StateEntry e;
      e.key = key;
      e.shape.assign(t.sizes().begin(), t.sizes().end());
      e.data = t.detach().to(at::kCPU).contiguous().reshape({-1});
      s.add_replicated(std::move(e));  // copies
    };
    for (const auto& [name, t] : model_tensors(model)) {
      if (units.count(t.unsafeGetTensorImpl())) continue;  // put_unit_shards' below
      auto it = mean.find(name);
      put(kModel + name, it != mean.end() ? it->second : t);
    }
    if (m.masters)
      for (size_t i = 0; i < m.build.params.size(); ++i)
        if (m.masters->master(i).defined())  // a unit's master is the algorithm's
          put(kMaster + m.build.params[i].first, m.masters->master(i));
  }
  if (m.shards) put_unit_shards(m, units, rank, s);
  snapshot_components(m, s);
  return s;
}

Manifest describe(DistributedOptimizer& opt, int world_size) {
  auto& m = Access::of(opt);
  Manifest out;
  out.step = m.steps;
  out.world_size = world_size;
  out.host_abi =
      std::to_string(DOPT_ABI_VERSION_MAJOR) + "." + std::to_string(DOPT_ABI_VERSION_MINOR);
  out.algorithm = record(m.build.algorithm, m.build.algorithm_options);
  out.reducer = record(m.build.reducer, m.build.reducer_options);
  out.optimizer = m.build.optimizer_name;
  out.optimizer_options = as_text(m.build.optimizer_options);
  out.group_lr = m.lr_set;
  out.schedule_phase = m.build.phase;
  out.epoch = m.epoch;
  if (const auto tuned = opt.autotuned_setting()) {
    out.autotune_bucket_cap_mb = tuned->bucket_cap_mb;
    out.autotune_overlap = tuned->overlap;
    out.autotune_hierarchical = tuned->hierarchical;
  }
  out.precision = precision_dtype_name(m.build.precision.dtype);
  if (m.scaler) {
    out.has_loss_scale = true;
    out.loss_scale = m.scaler->state();
  }
  return out;
}

void check_compatible(torch::nn::Module& model, DistributedOptimizer& opt, const StateSource& src,
                      const Manifest& man, const std::string& where) {
  auto& m = Access::of(opt);
  const ComponentInfo& red = m.build.reducer;
  if (man.reducer.plugin != red.plugin_name || man.reducer.component != red.name)
    log(DOPT_LOG_WARN, "checkpoint",
        where + ": saved with reducer " + man.reducer.plugin + "/" + man.reducer.component +
            ", loading into " + red.plugin_name + "/" + red.name +
            ": state under the other reducer's keys is not used");
  const ComponentInfo& alg = m.build.algorithm;
  if (man.algorithm.plugin != alg.plugin_name || man.algorithm.component != alg.name)
    log(DOPT_LOG_INFO, "checkpoint",
        where + ": saved with algorithm " + man.algorithm.plugin + "/" + man.algorithm.component +
            ", loading into " + alg.plugin_name + "/" + alg.name);
  if (man.optimizer != m.build.optimizer_name)
    throw CheckpointError(where + ": saved with inner optimizer '" + man.optimizer +
                          "', this job's is '" + m.build.optimizer_name + "'");
  require_state_api(m);
  // Parameter sharding: a unit's parameters are empty between steps; their
  // full shapes are the units'.
  const UnitTensors units = unit_tensors(model, m);
  for (const auto& [name, t] : model_tensors(model)) {
    const std::string key = kModel + name;
    if (!src.has(key))
      throw CheckpointError(where + ": has no '" + name + "' (the checkpoint is of another model)");
    const StateEntry& e = src.first(key);
    auto it = units.find(t.unsafeGetTensorImpl());
    const std::vector<int64_t> shape =
        it != units.end() ? it->second.member->shape : t.sizes().vec();
    if (e.shape != shape)
      throw CheckpointError(where + ": '" + name + "' has shape " +
                            c10::str(at::IntArrayRef(e.shape)) + " in the checkpoint, " +
                            c10::str(at::IntArrayRef(shape)) + " in the model");
  }
}

void restore(torch::nn::Module& model, DistributedOptimizer& opt, const StateSource& src,
             const Manifest& man) {
  auto& m = Access::of(opt);
  {
    // Parameter sharding: the units' parameters go to the algorithm's
    // shards, one unit at a time (no rank holds the whole model).
    const UnitTensors units = unit_tensors(model, m);
    at::NoGradGuard no_grad;
    for (auto& [name, t] : model_tensors(model)) {
      if (units.count(t.unsafeGetTensorImpl())) continue;
      at::Tensor whole = src.whole(kModel + name);
      t.detach().copy_(whole.view(t.sizes()));
    }
    if (m.shards) restore_unit_shards(m, src);
    if (m.masters) {
      for (size_t i = 0; i < m.build.params.size(); ++i) {
        const std::string key = kMaster + m.build.params[i].first;
        const at::Tensor& master = m.masters->master(i);
        if (!master.defined()) continue;  // a unit's: restored above
        if (src.has(key))
          master.detach().copy_(src.whole(key).view(master.sizes()));
        else if (master.data_ptr() != m.build.params[i].second.data_ptr())
          // Saved without mixed precision: the saved values, not their
          // rounding to the model's dtype.
          master.detach().copy_(src.whole(kModel + m.build.params[i].first).view(master.sizes()));
      }
    }
  }
  dopt_state_reader rr = src.reader(&kReducerPrefix);
  check_status(m.rvt->load_state(m.reducer, &rr), m.reducer_who, "load_state");
  dopt_state_reader ar = src.reader(&kAlgorithmPrefix);
  check_status(m.avt->load_state(m.algorithm, &ar), m.algorithm_who, "load_state");
  m.steps = man.step;
  m.epoch = man.epoch;
  // bytes_sent_plain_allreduce counts the steps run since make_optimizer,
  // as bytes_sent does (the restored steps were sent by another process).
  m.plain_bytes_base = 0;
  m.plain_steps_base = m.steps;
  // Learning rates set by the application (schedules) continue as saved.
  for (size_t g = 0; g < man.group_lr.size() && g < m.groups.size(); ++g)
    if (man.group_lr[g] >= 0) opt.set_lr(man.group_lr[g], static_cast<int>(g));
  if (m.scaler && man.has_loss_scale) {
    m.scaler->set_state(man.loss_scale);
  } else if (m.scaler) {
    log(DOPT_LOG_WARN, "checkpoint",
        "the checkpoint has no loss-scale state (saved without a precision: section); the loss "
        "scale starts from init_scale");
  }
}

namespace {

// A checkpoint saved in schedule phase k resumes in phase k: switch first,
// so that its state lands in the components that saved it. Collective (every
// rank reads the same manifest).
void resume_schedule_phase(DistributedOptimizer& opt, const Manifest& man,
                           const std::string& where) {
  const int saved = man.schedule_phase;
  if (saved < 0 || saved == opt.schedule_phase()) return;
  if (opt.schedule_phase() < 0) {
    log(DOPT_LOG_WARN, "checkpoint",
        where + ": saved in schedule phase " + std::to_string(saved) +
            "; this job has no schedule: loading into its " + opt.algorithm_name());
    return;
  }
  try {
    opt.switch_to_phase(saved);
  } catch (const ConfigError& e) {
    throw CheckpointError(where + ": saved in schedule phase " + std::to_string(saved) +
                          ", which this job's schedule does not have (" + e.what() + ")");
  }
}

// Autotuning chose its setting before this checkpoint: apply it, tune no
// more. Collective when it rebuilds (every rank reads the same manifest).
void resume_autotune(DistributedOptimizer& opt, const Manifest& man) {
  auto& m = Access::of(opt);
  if (!m.build.tuner || man.autotune_bucket_cap_mb <= 0) return;
  AutotuneSetting s;
  s.bucket_cap_mb = man.autotune_bucket_cap_mb;
  s.overlap = man.autotune_overlap < 0 ? m.build.reducer_options->get_bool("overlap")
                                       : man.autotune_overlap != 0;
  s.hierarchical = man.autotune_hierarchical < 0 ? m.build.reducer.name == "hierarchical"
                                                 : man.autotune_hierarchical != 0;
  std::shared_ptr<Autotuner> tuner = m.build.tuner;  // the rebuild copies the build
  tuner->restore(opt, s);
}

}  // namespace

OptimizerCheckpoint::OptimizerCheckpoint(torch::nn::Module& model, DistributedOptimizer& opt)
    : model_(model), opt_(opt) {}

Manifest OptimizerCheckpoint::describe(int world_size) { return optim::describe(opt_, world_size); }

ShardState OptimizerCheckpoint::snapshot(int rank) { return optim::snapshot(model_, opt_, rank); }

void OptimizerCheckpoint::resume(const Manifest& m, const std::string& where) {
  resume_schedule_phase(opt_, m, where);
  resume_autotune(opt_, m);
}

void OptimizerCheckpoint::check_compatible(const StateSource& src, const Manifest& m,
                                           const std::string& where) {
  optim::check_compatible(model_, opt_, src, m, where);
}

void OptimizerCheckpoint::restore(const StateSource& src, const Manifest& m) {
  optim::restore(model_, opt_, src, m);
}

}  // namespace distopt::optim
