#include "fused_algorithm.hpp"

#include <string>
#include <utility>

#include "distopt/sdk/base/tensor_state.hpp"
#include "distopt/sdk/optim/algorithm_args.hpp"
#include "distopt/sdk/optim/grad_clip.hpp"
#include "distopt/sdk/optim/optimizer_state.hpp"

namespace distopt::plugins::fused {
namespace {

bool is_f32(const DLTensor& t) {
  return t.dtype.code == kDLFloat && t.dtype.bits == 32 && t.dtype.lanes == 1;
}
int64_t numel_of(const DLTensor& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}
void* data_of(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }
std::string name_of(const dopt_param& p) { return p.name ? p.name : "?"; }
std::vector<int64_t> shape_of(const DLTensor& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}
// Each slot's optimizer state starts on a 64-byte boundary of its group's
// buffers: PyTorch's multi-tensor kernels (_fused_adam_) take their
// vectorised path only where every tensor of a chunk is 16-byte aligned, and
// the host loops load whole cache lines.
constexpr int64_t kStateAlign = 64 / sizeof(float);
int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
// A non-owning 1-D fp32 tensor over n elements at p on device d.
at::Tensor float_view(const float* p, int64_t n, const at::Device& d) {
  return at::from_blob(const_cast<float*>(p), {n}, at::TensorOptions().dtype(at::kFloat).device(d));
}

}  // namespace

FusedAlgorithm::FusedAlgorithm(const dopt_algorithm_args& args)
    : reducer_(args.reducer),
      rank_(sdk::check_algorithm_args(args, "fused", sdk::kNeedsReducer).rank),
      world_size_(args.common->world_size) {
  grads_ = sdk::trainable_grads(args);
  sdk::OptionsView opts(args.common->options);
  do_flatten_ = opts.get_bool("do_flatten");
  check_flatten_ = opts.get_bool("check_flatten");
  const std::string kernels = opts.get_string("kernels");

  optimizer_ = args.optimizer_name ? args.optimizer_name : "";
  sdk::OptionsView o(args.optimizer_options);
  if (optimizer_ == "sgd") {
    momentum_ = o.get_double("momentum");
    dampening_ = o.get_double("dampening");
    nesterov_ = o.get_bool("nesterov");
    if (nesterov_ && (momentum_ <= 0 || dampening_ != 0))
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                       "optimizer sgd: nesterov needs momentum > 0 and dampening 0");
  } else if (optimizer_ == "adam" || optimizer_ == "adamw") {
    beta1_ = o.get_double("beta1");
    beta2_ = o.get_double("beta2");
    eps_ = o.get_double("eps");
    amsgrad_ = o.get_bool("amsgrad");
  } else {
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "fused: optimizer '" + optimizer_ +
                         "' has no fused kernel (fused supports sgd, adam, adamw; use the "
                         "allreduce algorithm for others)");
  }
  const double lr = o.get_double("lr"), wd = o.get_double("weight_decay");
  groups_.resize(args.num_groups);
  for (size_t g = 0; g < args.num_groups; ++g) {
    groups_[g].lr = args.groups[g].lr >= 0 ? args.groups[g].lr : lr;
    groups_[g].weight_decay = args.groups[g].weight_decay >= 0 ? args.groups[g].weight_decay : wd;
  }

  // Slots in the buckets' layout order, so each group's state mirrors the
  // order its gradients sit in the buckets.
  std::vector<int64_t> group_size(args.num_groups, 0);
  std::vector<bool> seen(args.num_params, false);
  // Every parameter and bucket on one device (the first bucket's): a group's
  // state is one buffer, and a chunk one list of one device's tensors.
  bool have_device = false;
  auto check_device = [&](const DLTensor& t, const std::string& what) {
    const at::Device d = sdk::to_device(t.device);  // UNSUPPORTED for other device types
    if (!have_device) {
      device_ = d;
      have_device = true;
    } else if (d != device_) {
      throw sdk::Error(DOPT_ERR_UNSUPPORTED, "fused: " + what + " is on " + d.str() +
                                                 ", other parameters or buckets on " +
                                                 device_.str() + " (one device per job)");
    }
  };
  for (size_t b = 0; b < args.num_buckets; ++b) {
    const dopt_bucket& bk = args.buckets[b];
    buckets_.push_back(&bk);
    if (!is_f32(*bk.flat))
      throw sdk::Error(DOPT_ERR_UNSUPPORTED, "fused: buckets must be fp32 tensors");
    check_device(*bk.flat, "bucket " + std::to_string(b));
    const float* flat = static_cast<const float*>(data_of(*bk.flat));
    for (size_t e = 0; e < bk.num_entries; ++e) {
      const dopt_bucket_entry& en = bk.entries[e];
      if (en.param_index < 0 || static_cast<size_t>(en.param_index) >= args.num_params)
        throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "fused: bucket entry with a bad param_index");
      const dopt_param& p = args.params[en.param_index];
      if (!p.requires_grad || !p.grad) continue;
      if (!is_f32(*p.data))
        throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                         "fused: parameter " + name_of(p) + " is not an fp32 tensor");
      check_device(*p.data, "parameter " + name_of(p));
      if (numel_of(*p.data) != static_cast<int64_t>(en.numel))
        throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                         "fused: bucket entry of " + name_of(p) + " has the wrong numel");
      seen[en.param_index] = true;
      Slot s{&p,      flat + en.offset,    static_cast<int64_t>(en.numel),
             p.group, group_size[p.group], data_of(*p.data)};
      group_size[p.group] += round_up(s.numel, kStateAlign);
      groups_[static_cast<size_t>(p.group)].elements += s.numel;
      slots_.push_back(s);
    }
  }
  for (size_t i = 0; i < args.num_params; ++i)
    if (args.params[i].requires_grad && args.params[i].grad && !seen[i])
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                       "fused: parameter " + name_of(args.params[i]) + " is in no bucket");
  pending_.resize(buckets_.size());

  if (kernels == "host" && !device_.is_cpu())
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "fused: kernels: host runs on CPU parameters only, these are on " +
                         device_.str() + " (use kernels: auto or torch)");
  torch_ = kernels == "torch" || (kernels != "host" && !device_.is_cpu());

  const int nstate = optimizer_ == "sgd" ? (momentum_ != 0 ? 1 : 0) : (amsgrad_ ? 3 : 2);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int k = 0; k < nstate; ++k) groups_[g].state[k] = at::zeros({group_size[g]}, f32);
    groups_[g].step = at::zeros({}, f32);
  }
  flatten();
}

void FusedAlgorithm::flatten() {
  chunks_.clear();
  // do_flatten: one chunk per group, every slot at its group state offset.
  // Otherwise a slot joins the previous chunk only when its parameter,
  // gradient and state memory directly follow the previous slot's (same
  // group).
  std::vector<int> chunk_of_group(groups_.size(), -1);
  for (const Slot& s : slots_) {
    float* param = static_cast<float*>(data_of(*s.param->data));
    FusedChunk* c = nullptr;
    if (do_flatten_) {
      if (chunk_of_group[s.group] >= 0) c = &chunks_[chunk_of_group[s.group]];
    } else if (!chunks_.empty() && chunks_.back().group == s.group) {
      const FusedChunk& prev = chunks_.back();
      const fused::Segment& last = prev.chunk.segments.back();
      if (last.param + last.n == param && last.grad + last.n == s.grad &&
          prev.base + last.state_offset + last.n == s.state_offset)
        c = &chunks_.back();
    }
    if (!c) {
      Group& g = groups_[s.group];
      FusedChunk fc;
      fc.group = s.group;
      // A chunk's state starts at its first slot's offset (0 for a whole group).
      fc.base = do_flatten_ ? 0 : s.state_offset;
      // Host pointers for the host kernels (CPU only: never dereferenced otherwise).
      float** ptr[3] = {&fc.chunk.state0, &fc.chunk.state1, &fc.chunk.state2};
      for (int k = 0; k < 3; ++k)
        *ptr[k] = g.state[k].defined() && device_.is_cpu() ? g.state[k].data_ptr<float>() + fc.base
                                                           : nullptr;
      if (do_flatten_) chunk_of_group[s.group] = static_cast<int>(chunks_.size());
      chunks_.push_back(fc);
      c = &chunks_.back();
    }
    fused::Chunk& ch = c->chunk;
    // Slots are visited in state order: a chunk's segments are sorted by
    // state offset, with alignment gaps between them (in no segment).
    const int64_t rel = s.state_offset - c->base;
    if (!ch.segments.empty()) {
      fused::Segment& last = ch.segments.back();
      if (last.param + last.n == param && last.grad + last.n == s.grad &&
          last.state_offset + last.n == rel) {
        last.n += s.numel;  // adjacent parameter, gradient and state: one segment
        ch.total = rel + s.numel;
        continue;
      }
    }
    ch.segments.push_back({param, s.grad, s.numel, rel});
    ch.total = rel + s.numel;
  }
  if (torch_)
    for (FusedChunk& fc : chunks_) build_tensors(fc);
}

void FusedAlgorithm::build_tensors(FusedChunk& fc) {
  // The same segments as 1-D views: parameters and gradients aliasing the
  // host's memory, state aliasing the group's buffers.
  const Group& g = groups_[static_cast<size_t>(fc.group)];
  fused::TensorChunk& t = fc.tensors;
  t = fused::TensorChunk{};
  std::vector<at::Tensor>* state[3] = {&t.state0, &t.state1, &t.state2};
  for (const fused::Segment& seg : fc.chunk.segments) {
    t.params.push_back(float_view(seg.param, seg.n, device_));
    t.grads.push_back(float_view(seg.grad, seg.n, device_));
    for (int k = 0; k < 3; ++k)
      if (g.state[k].defined())
        state[k]->push_back(g.state[k].narrow(0, fc.base + seg.state_offset, seg.n));
  }
  t.step = g.step;
}

bool FusedAlgorithm::layout_changed() {
  bool changed = false;
  for (Slot& s : slots_) {
    const DLTensor& t = *s.param->data;
    void* now = data_of(t);
    if (now == s.snapshot) continue;
    if (!is_f32(t) || sdk::to_device(t.device) != device_ || numel_of(t) != s.numel)
      throw sdk::Error(DOPT_ERR_STATE, "fused: parameter " + name_of(*s.param) +
                                           " changed dtype, device or size since it was "
                                           "flattened; its optimizer state cannot be mapped");
    sdk::log_warn("fused", "check_flatten: parameter " + name_of(*s.param) +
                               " no longer aliases the flattened layout (its .data was "
                               "replaced); re-flattening, optimizer state kept");
    s.snapshot = now;
    changed = true;
  }
  return changed;
}

void FusedAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= buckets_.size())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "fused: unknown bucket " + std::to_string(bucket.index));
  auto& slot = pending_[static_cast<size_t>(bucket.index)];
  if (slot.valid())
    throw sdk::Error(DOPT_ERR_STATE, "fused: bucket " + std::to_string(bucket.index) +
                                         " is ready twice in one step");
  // The reducer averages the host's bucket in place: the very memory the
  // kernels read as gradients.
  slot = reducer_.reduce(*buckets_[static_cast<size_t>(bucket.index)]);
}

void FusedAlgorithm::step() {
  try {
    for (size_t b = 0; b < pending_.size(); ++b) {
      if (!pending_[b].valid())
        throw sdk::Error(DOPT_ERR_STATE,
                         "fused: step() before bucket " + std::to_string(b) + " was ready");
      pending_[b].wait();
      pending_[b].reset();
    }
  } catch (...) {
    for (auto& p : pending_) p.reset();
    throw;
  }
  if (check_flatten_ && layout_changed()) {
    flatten();
    ++reflattens_;
    sdk::metric_add("fused.reflattens", 1);
  }
  if (grad_clip_ > 0) {
    at::NoGradGuard ng;
    sdk::clip_grad_norm(grads_, grad_clip_, sdk::GradParts::replicated);
  }
  run_optimizer();
  sdk::metric_add("algorithm.steps", 1);
}

void FusedAlgorithm::run_optimizer() {
  for (Group& g : groups_) ++g.steps;
  for (FusedChunk& fc : chunks_) {
    const Group& g = groups_[fc.group];
    if (optimizer_ == "sgd") {
      const fused::SgdHyper h{g.lr, momentum_, dampening_, g.weight_decay, nesterov_, g.steps == 1};
      torch_ ? fused::sgd_step_torch(fc.tensors, h) : fused::sgd_step(fc.chunk, h);
    } else {
      const fused::AdamHyper h{
          g.lr, beta1_, beta2_, eps_, g.weight_decay, amsgrad_, optimizer_ == "adamw", g.steps};
      torch_ ? fused::adam_step_torch(fc.tensors, h) : fused::adam_step(fc.chunk, h);
    }
  }
}

void FusedAlgorithm::set_grad_clip(double max_norm) {
  grad_clip_ = sdk::checked_max_norm(max_norm, "fused");
}

void FusedAlgorithm::set_lr(int32_t group, double lr) {
  if (group < 0 || static_cast<size_t>(group) >= groups_.size())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "fused: no parameter group " + std::to_string(group));
  if (!(lr >= 0) || !(lr < 1e300))
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "lr must be finite and >= 0");
  groups_[static_cast<size_t>(group)].lr = lr;
}

uint64_t FusedAlgorithm::state_bytes() const {
  // Like sdk::optimizer_state_bytes: 0 before the first step (libtorch
  // creates its state lazily), then the state tensors' bytes.
  // The parameters' elements only, not the alignment gaps between them.
  uint64_t n = 0;
  for (const Group& g : groups_)
    if (g.steps > 0)
      for (const at::Tensor& t : g.state)
        if (t.defined()) n += static_cast<uint64_t>(g.elements);
  return n * sizeof(float);
}

}  // namespace distopt::plugins::fused

namespace distopt::plugins::fused {

std::vector<std::pair<const char*, int>> FusedAlgorithm::state_fields() const {
  if (optimizer_ == "sgd") {
    if (momentum_ == 0) return {};
    return {{"momentum_buffer", 0}};
  }
  std::vector<std::pair<const char*, int>> f = {{"exp_avg", 0}, {"exp_avg_sq", 1}};
  if (amsgrad_) f.emplace_back("max_exp_avg_sq", 2);
  return f;
}

at::Tensor FusedAlgorithm::state_of(const Slot& s, int index) {
  return groups_[static_cast<size_t>(s.group)].state[index].narrow(0, s.state_offset, s.numel);
}

void FusedAlgorithm::save_state(sdk::StateWriter& all) {
  // Replicated state: every rank holds the whole logical tensor (state.h).
  // Before the first step there is none, as for a fresh libtorch optimizer.
  sdk::StateWriter w = all.replicated(rank_);
  const auto fields = state_fields();
  for (const Slot& s : slots_) {
    const int64_t steps = groups_[static_cast<size_t>(s.group)].steps;
    if (steps == 0) continue;
    const std::string name = name_of(*s.param);
    const std::vector<int64_t> shape = shape_of(*s.param->data);
    if (optimizer_ != "sgd")
      sdk::put_sharded(w, sdk::optimizer_state_key(name, "step"), at::full({1}, steps, at::kLong),
                       0, {});
    for (const auto& [field, index] : fields)
      sdk::put_sharded(w, sdk::optimizer_state_key(name, field), state_of(s, index), 0, shape);
  }
}

void FusedAlgorithm::load_state(const sdk::StateReader& r) {
  // The field that says whether a parameter has state: sgd keeps no step.
  const bool sgd = optimizer_ == "sgd";
  const char* marker = sgd ? "momentum_buffer" : "step";
  const auto fields = state_fields();
  // Validate everything before changing anything: the slots of a group must
  // agree on having state and (adam) on the step, since one counter drives them.
  std::vector<int64_t> step(groups_.size(), -1);
  std::vector<std::string> first_key(groups_.size());
  for (const Slot& s : slots_) {
    const size_t g = static_cast<size_t>(s.group);
    const std::string name = name_of(*s.param);
    if (sgd && r.find(sdk::optimizer_state_key(name, "step")))
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                       "fused: checkpoint has state '" + sdk::optimizer_state_key(name, "step") +
                           "', which optimizer sgd does not keep: it was saved with another "
                           "optimizer");
    const std::string key = sdk::optimizer_state_key(name, marker);
    int64_t st = 0;
    if (r.find(key)) {
      st = sgd ? 1 : sdk::read_range(r, key, 0, 1, at::kLong).item<int64_t>();
    } else {
      sdk::check_no_foreign_state(r, name, marker, optimizer_);
    }
    if (st > 0)
      for (const auto& f : fields)
        if (!r.find(sdk::optimizer_state_key(name, f.first)))
          throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "fused: checkpoint has '" + key +
                                                          "' but no state '" +
                                                          sdk::optimizer_state_key(name, f.first) +
                                                          "' for optimizer " + optimizer_);
    if (step[g] < 0) {
      step[g] = st;
      first_key[g] = key;
    } else if (st != step[g] && !(sgd && momentum_ == 0)) {
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                       "fused: checkpoint state '" + key + "' " +
                           (st == 0 ? "is missing" : "says step " + std::to_string(st)) + " but '" +
                           first_key[g] + "' " +
                           (step[g] == 0 ? "is missing" : "says step " + std::to_string(step[g])) +
                           ": fused keeps one step per parameter group");
    }
  }
  for (const Slot& s : slots_) {
    const std::string name = name_of(*s.param);
    const int64_t st = step[static_cast<size_t>(s.group)];
    for (const auto& [field, index] : fields) {
      at::Tensor dst = state_of(s, index);
      if (st > 0)
        sdk::read_into(r, sdk::optimizer_state_key(name, field), 0, dst);
      else
        dst.zero_();
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].steps = std::max<int64_t>(0, step[g]);
}

}  // namespace distopt::plugins::fused
