#include "hybrid_algorithm.hpp"

#include <atomic>
#include <cstring>
#include <string>
#include <utility>

#include "distopt/sdk/optimizer_factory.hpp"
#include "distopt/sdk/tensor.hpp"
#include "distopt/sdk/tensor_state.hpp"
#include "offload_split.hpp"

namespace distopt::plugins::hybrid {
namespace {

void* data_of(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

// Whether `model` holds exactly the bits of `master` rounded to the model's
// dtype (what hybrid wrote back after its last step). A CUDA model is read
// to the host first (one extra D2H; UNVERIFIED, no GPU was available).
bool same_bits(const at::Tensor& model, const at::Tensor& master) {
  at::Tensor m = model.is_cpu() ? model.contiguous() : model.to(at::kCPU).contiguous();
  at::Tensor c = master.scalar_type() == m.scalar_type() && master.is_cpu()
                     ? master.contiguous()
                     : master.to(at::kCPU, m.scalar_type()).contiguous();
  return std::memcmp(m.data_ptr(), c.data_ptr(), m.nbytes()) == 0;
}

// A host buffer like `model` in `dtype`; pinned when the model is on CUDA,
// so copies between them can be asynchronous (UNVERIFIED without a GPU).
at::Tensor host_buffer(const at::Tensor& model, at::ScalarType dtype) {
  return at::empty(model.sizes(), at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(
                                      model.is_cuda()));
}

// Completions of work that may still run: wait for all (errors ignored),
// so nothing still references this step's state when we unwind.
void drain(const std::vector<std::shared_ptr<sdk::Completion>>& done) noexcept {
  for (const auto& d : done) {
    if (!d) continue;
    try {
      d->wait(-1);
    } catch (...) {
    }
  }
}

}  // namespace

void HybridAlgorithm::check_job(const sdk::JobView& job) {
  if (job.self().options().get_bool("shard"))
    job.reject("algorithm.options.shard",
               "hybrid does not shard its offloaded part yet: every rank steps all of it (the "
               "host copies and state are replicated, as in allreduce); use shard: false, or "
               "algorithm zero for sharded optimizer state without offload",
               DOPT_ERR_UNSUPPORTED);
}

HybridAlgorithm::HybridAlgorithm(const dopt_algorithm_args& args)
    : reducer_(args.reducer),
      rank_(args.common ? args.common->rank : 0),
      world_size_(args.common ? args.common->world_size : 0) {
  if (!args.common || !args.reducer.vt || !args.reducer.reducer)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "hybrid: needs common args and a reducer");
  if (world_size_ < 1) throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "hybrid: world_size < 1");
  const sdk::OptionsView opts(args.common->options);
  const double fraction = opts.get_double("offload_fraction");
  fp32_update_ = opts.get_bool("param_update_in_fp32");
  refresh_ = opts.get_bool("refresh_masters");
  const bool overlap = opts.get_bool("overlap_cpu_optimizer_d2h_h2d");
  if (opts.get_bool("shard"))
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, "hybrid: shard: true is not implemented");

  for (size_t b = 0; b < args.num_buckets; ++b) buckets_.push_back(&args.buckets[b]);
  pending_.resize(args.num_buckets);

  std::vector<int64_t> numels;
  for (size_t i = 0; i < args.num_params; ++i) {
    const dopt_param& d = args.params[i];
    if (!d.requires_grad || !d.grad) continue;
    Param p;
    p.desc = &d;
    p.name = d.name ? d.name : "";
    if (d.group < 0 || static_cast<size_t>(d.group) >= args.num_groups)
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "hybrid: parameter " + p.name + " has group " +
                                                      std::to_string(d.group) + " of " +
                                                      std::to_string(args.num_groups));
    p.group = d.group;
    p.model = sdk::as_tensor(*d.data);
    p.model_ptr = data_of(*d.data);
    p.grad = sdk::as_tensor(*d.grad);
    p.slice = {p.name, 0, std::vector<int64_t>(p.model.sizes().begin(), p.model.sizes().end())};
    numels.push_back(p.model.numel());
    params_.push_back(std::move(p));
  }
  std::vector<bool> offloaded;
  try {
    offloaded = offload_split(numels, fraction);
  } catch (const std::invalid_argument& e) {
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string("hybrid: ") + e.what());
  }

  bool any_cuda = false;
  const sdk::OptionsView o(args.optimizer_options);
  const std::string opt_name = args.optimizer_name ? args.optimizer_name : "";
  for (size_t k = 0; k < params_.size(); ++k) {
    Param& p = params_[k];
    any_cuda = any_cuda || p.model.is_cuda();
    const bool to_fp32 =
        fp32_update_ && p.model.is_floating_point() && p.model.scalar_type() != at::kFloat;
    if (!offloaded[k]) {
      device_.push_back(k);
      continue;
    }
    host_.push_back(k);
    const at::ScalarType dt = to_fp32 ? at::kFloat : p.model.scalar_type();
    p.master = host_buffer(p.model, dt);
    p.master.copy_(p.model);
    p.host_grad = host_buffer(p.model, dt);
    p.host_grad.zero_();
    p.master.mutable_grad() = p.host_grad;
    p.stepped = p.master;
    sdk::ParamGroupInput g;
    g.params = {p.master};
    g.lr = args.groups[p.group].lr;
    g.weight_decay = args.groups[p.group].weight_decay;
    p.host_opt = sdk::make_optimizer(opt_name, o, {g});
  }
  build_device_optimizer(args);
  if (any_cuda)
    sdk::log_warn("hybrid",
                  "parameters on CUDA: copies run through the host transfer (synchronous "
                  "copy_, no side streams); this path has never run on a GPU (UNVERIFIED)");
  d2h_ = std::make_unique<HostTransfer>("hybrid d2h", overlap);
  h2d_ = std::make_unique<HostTransfer>("hybrid h2d", overlap);
  int64_t host_numel = 0;
  for (size_t k : host_) host_numel += params_[k].model.numel();
  sdk::metric_add("hybrid.offloaded_numel", static_cast<double>(host_numel));
}

HybridAlgorithm::~HybridAlgorithm() = default;

void HybridAlgorithm::build_device_optimizer(const dopt_algorithm_args& args) {
  std::vector<sdk::ParamGroupInput> groups(args.num_groups);
  for (size_t g = 0; g < args.num_groups; ++g) {
    groups[g].lr = args.groups[g].lr;
    groups[g].weight_decay = args.groups[g].weight_decay;
  }
  device_slices_.assign(args.num_groups, {});
  for (size_t k : device_) {
    Param& p = params_[k];
    if (fp32_update_ && p.model.is_floating_point() && p.model.scalar_type() != at::kFloat) {
      p.master = p.model.to(at::kFloat).clone();  // fp32 master on the parameter's device
      p.stepped = p.master;
    } else {
      // A separate alias of the same memory, so a re-pointed parameter can be
      // followed with set_data while the optimizer keeps its state key.
      p.stepped = sdk::as_tensor(*p.desc->data);
      p.stepped.mutable_grad() = p.grad;
    }
    groups[p.group].params.push_back(p.stepped);
    device_slices_[p.group].push_back(p.slice);
  }
  device_opt_ = sdk::make_optimizer(args.optimizer_name ? args.optimizer_name : "",
                                    sdk::OptionsView(args.optimizer_options), groups);
}

void HybridAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= buckets_.size())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "hybrid: unknown bucket " + std::to_string(bucket.index));
  auto& slot = pending_[static_cast<size_t>(bucket.index)];
  if (slot.valid())
    throw sdk::Error(DOPT_ERR_STATE, "hybrid: bucket " + std::to_string(bucket.index) +
                                         " is ready twice in one step");
  slot = reducer_.reduce(*buckets_[static_cast<size_t>(bucket.index)]);
}

void HybridAlgorithm::follow_moved_params() {
  // The host re-points a parameter's descriptor when user code replaced its
  // .data (same size and dtype) before calling step().
  for (Param& p : params_) {
    void* now = data_of(*p.desc->data);
    if (now == p.model_ptr) continue;
    p.model = sdk::as_tensor(*p.desc->data);
    p.model_ptr = now;
    if (p.stepped.defined() && !p.master.defined()) p.stepped.set_data(p.model);
  }
}

bool HybridAlgorithm::refresh_if_changed(Param& p) {
  if (!refresh_ || !p.master.defined() || same_bits(p.model, p.master)) return false;
  p.master.copy_(p.model);
  return true;
}

void HybridAlgorithm::note_refreshed(int64_t count) {
  if (count == 0) return;
  sdk::metric_add("hybrid.refreshed_params", static_cast<double>(count));
  sdk::log_warn("hybrid", std::to_string(count) +
                              " parameter(s) changed outside the optimizer since its last step "
                              "(model weights loaded or copied in?): their optimizer copies were "
                              "refreshed from the model");
}

void HybridAlgorithm::step() {
  at::NoGradGuard ng;
  try {
    for (size_t b = 0; b < pending_.size(); ++b) {
      if (!pending_[b].valid())
        throw sdk::Error(DOPT_ERR_STATE,
                         "hybrid: step() before bucket " + std::to_string(b) + " was ready");
      pending_[b].wait();
      pending_[b].reset();
    }
  } catch (...) {
    for (auto& p : pending_) p.reset();  // a failed step leaves no stale requests behind
    throw;
  }
  follow_moved_params();
  step_host();
  sdk::metric_add("algorithm.steps", 1);
}

void HybridAlgorithm::step_device() {
  int64_t refreshed = 0;
  for (size_t k : device_) {
    Param& p = params_[k];
    if (!p.master.defined()) continue;
    refreshed += refresh_if_changed(p) ? 1 : 0;
    p.master.mutable_grad() = p.grad.to(at::kFloat);
  }
  note_refreshed(refreshed);
  device_opt_->step();
  for (size_t k : device_)
    if (params_[k].master.defined()) params_[k].model.copy_(params_[k].master);
}

void HybridAlgorithm::step_host() {
  std::vector<std::shared_ptr<sdk::Completion>> d2h(host_.size()), h2d(host_.size());
  std::atomic<int64_t> refreshed{0};
  try {
    // (1) D2H of every chunk, in order: refresh check, then the gradient.
    for (size_t c = 0; c < host_.size(); ++c) {
      Param* p = &params_[host_[c]];
      d2h[c] = d2h_->submit(
          [this, p, &refreshed] {
            at::NoGradGuard ng;
            if (refresh_if_changed(*p)) ++refreshed;
            p->host_grad.copy_(p->grad);
          },
          "d2h of " + p->name);
    }
    // (2) The device part meanwhile (its parameters are disjoint from these).
    step_device();
    // (3) Per chunk: its copy landed, step it on the host, copy it back.
    for (size_t c = 0; c < host_.size(); ++c) {
      Param* p = &params_[host_[c]];
      d2h[c]->wait(-1);
      p->host_opt->step();
      h2d[c] = h2d_->submit(
          [p] {
            at::NoGradGuard ng;
            p->model.copy_(p->master);
          },
          "h2d of " + p->name);
    }
    for (auto& d : h2d) d->wait(-1);
  } catch (...) {
    drain(d2h);
    drain(h2d);
    throw;
  }
  note_refreshed(refreshed.load());
}

void HybridAlgorithm::set_lr(int32_t group, double lr) {
  if (group < 0 || static_cast<size_t>(group) >= device_slices_.size())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "hybrid: no parameter group " + std::to_string(group));
  sdk::set_group_lr(*device_opt_, static_cast<size_t>(group), lr);
  for (size_t k : host_)
    if (params_[k].group == group) sdk::set_group_lr(*params_[k].host_opt, 0, lr);
}

uint64_t HybridAlgorithm::state_bytes() const {
  uint64_t n = sdk::optimizer_state_bytes(*device_opt_);
  for (size_t k : host_) n += sdk::optimizer_state_bytes(*params_[k].host_opt);
  return n;
}

void HybridAlgorithm::save_state(sdk::StateWriter& w) {
  // Replicated state: rank 0's copy is the whole logical tensor (state.h).
  if (rank_ != 0) return;
  sdk::save_optimizer_state(*device_opt_, device_slices_, w);
  for (size_t k : host_) sdk::save_optimizer_state(*params_[k].host_opt, {{params_[k].slice}}, w);
}

void HybridAlgorithm::load_state(const sdk::StateReader& r) {
  at::NoGradGuard ng;
  sdk::load_optimizer_state(*device_opt_, device_slices_, r);
  for (size_t k : host_) sdk::load_optimizer_state(*params_[k].host_opt, {{params_[k].slice}}, r);
  // The host loaded the model before this call: the copies follow it.
  follow_moved_params();
  int64_t refreshed = 0;
  for (Param& p : params_) refreshed += refresh_if_changed(p) ? 1 : 0;
  if (refreshed > 0) sdk::metric_add("hybrid.refreshed_params", static_cast<double>(refreshed));
}

}  // namespace distopt::plugins::hybrid
