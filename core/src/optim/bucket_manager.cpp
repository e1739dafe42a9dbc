#include "optim/bucket_manager.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distopt/error.hpp"
#include "optim/storage.hpp"

namespace distopt::optim {
namespace {

int dtype_code(const at::Tensor& t) {
  // One bucket = one dtype on one device.
  const auto& d = t.device();
  return static_cast<int>(t.scalar_type()) +
         100 * (static_cast<int>(d.type()) * 256 + (d.has_index() ? d.index() + 1 : 0));
}

bool aliases(const at::Tensor& g, const at::Tensor& view) {
  return g.defined() && g.data_ptr() == view.data_ptr() && g.sizes().equals(view.sizes()) &&
         g.strides().equals(view.strides()) && g.scalar_type() == view.scalar_type();
}

}  // namespace

BucketManager::BucketManager(const std::vector<std::pair<std::string, at::Tensor>>& params,
                             const BucketOptions& opts, LaunchFn launch)
    : opts_(opts), launch_(std::move(launch)) {
  std::vector<PlanInput> inputs;
  std::vector<size_t> input_param;  // plan index -> params_ index
  params_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    Param p;
    p.name = name;
    p.tensor = t;
    params_.push_back(std::move(p));
    if (!t.defined()) throw Error("parameter '" + name + "' is an undefined tensor");
    if (!t.requires_grad()) continue;
    if (t.is_sparse() || !t.is_contiguous())
      throw Error("parameter '" + name + "' must be a dense, contiguous tensor");
    inputs.push_back(
        {static_cast<size_t>(t.numel()),
         opts.plan_element_size ? opts.plan_element_size : static_cast<size_t>(t.element_size()),
         dtype_code(t), i < opts.units.size() ? opts.units[i] : -1});
    input_param.push_back(i);
  }

  auto plan = plan_buckets(inputs, opts.cap_bytes, opts.align_bytes);
  buckets_.resize(plan.size());
  for (size_t b = 0; b < plan.size(); ++b) {
    Bucket& bk = buckets_[b];
    bk.unit = plan[b].unit;
    const auto& first = params_[input_param[plan[b].entries.at(0).param]].tensor;
    // A unit's bucket gets its memory with its first gradient (a model
    // larger than a rank's memory must never hold all its gradients).
    bk.flat = bk.unit >= 0 ? at::empty({static_cast<int64_t>(plan[b].length)},
                                       first.options().requires_grad(false))
                           : at::zeros({static_cast<int64_t>(plan[b].length)},
                                       first.options().requires_grad(false));
    bk.flat_dl = sdk::DLView(bk.flat);
    for (const auto& e : plan[b].entries) {
      size_t i = input_param[e.param];
      Param& p = params_[i];
      p.bucket = static_cast<int>(b);
      p.view = bk.flat.narrow(0, static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel))
                   .view(p.tensor.sizes());
      bk.params.push_back(i);
      bk.shapes.emplace_back(p.tensor.sizes().begin(), p.tensor.sizes().end());
      dopt_bucket_entry d{};
      d.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
      d.name = p.name.c_str();
      d.param_index = static_cast<int32_t>(i);
      d.offset = e.offset;
      d.numel = e.numel;
      d.ndim = static_cast<int32_t>(p.tensor.dim());
      bk.entries.push_back(d);
    }
    for (size_t k = 0; k < bk.entries.size(); ++k)
      bk.entries[k].shape = bk.shapes[k].empty() ? nullptr : bk.shapes[k].data();
    bk.pending = bk.params.size();
  }
  descs_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    dopt_bucket& d = descs_[b];
    d.struct_size = DOPT_BUCKET_STRUCT_SIZE;
    d.ext = nullptr;
    d.index = static_cast<int32_t>(b);
    d.flat = buckets_[b].flat_dl.get();
    d.entries = buckets_[b].entries.data();
    d.num_entries = buckets_[b].entries.size();
  }

  // .grad becomes the bucket view (keeping any gradient already there), and
  // a post hook on each accumulator reports the gradient as ready.
  at::NoGradGuard no_grad;
  for (auto& bk : buckets_) {
    if (bk.unit < 0) continue;
    bool any_grad = false;
    for (size_t i : bk.params) any_grad = any_grad || params_[i].tensor.grad().defined();
    if (any_grad)
      bk.flat.zero_();  // kept: the gradients already there are copied in below
    else
      free_storage(bk.flat);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.view.defined()) continue;
    hook(i);
    if (!allocated(buckets_[static_cast<size_t>(p.bucket)])) continue;  // .grad stays undefined
    const at::Tensor& g = p.tensor.grad();
    if (g.defined() && !aliases(g, p.view)) p.view.copy_(g);
    p.tensor.mutable_grad() = p.view;
  }
  attached_ = true;
}

void BucketManager::hook(size_t i) {
  Param& p = params_[i];
  p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
  if (!p.accumulator)
    throw Error("parameter '" + p.name + "' has no gradient accumulator (not a leaf?)");
  p.hook_key =
      p.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, i](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
            on_grad_ready(i);
            return outputs;
          }));
}

bool BucketManager::rehook_if_replaced(size_t i) {
  Param& p = params_[i];
  if (!p.view.defined() || !p.accumulator) return false;
  if (torch::autograd::impl::grad_accumulator(p.tensor) == p.accumulator) return false;
  p.accumulator->del_post_hook(p.hook_key);
  hook(i);
  return true;
}

BucketManager::~BucketManager() { detach(); }

void BucketManager::detach() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (!attached_) return;
  for (auto& p : params_) {
    if (p.accumulator) p.accumulator->del_post_hook(p.hook_key);
    p.accumulator.reset();
  }
  attached_ = false;
}

uint64_t BucketManager::bucket_bytes(size_t b) const {
  const auto& f = buckets_.at(b).flat;
  return static_cast<uint64_t>(f.numel()) * f.element_size();
}

void BucketManager::ensure_view(Param& p) {
  // AccumulateGrad accumulates in place into a defined .grad; only a grad the
  // user replaced (set to None, assigned) or one made under create_graph is
  // a new tensor: copy it into the bucket and point .grad back at the view.
  const at::Tensor& g = p.tensor.grad();
  if (aliases(g, p.view)) return;
  at::NoGradGuard no_grad;
  if (g.defined())
    p.view.copy_(g);
  else
    p.view.zero_();
  p.tensor.mutable_grad() = p.view;
}

bool BucketManager::allocated(const Bucket& bk) const {
  return bk.unit < 0 || storage_bytes(bk.flat) > 0;
}

void BucketManager::ensure_allocated(Bucket& bk) {
  if (allocated(bk)) return;
  at::NoGradGuard no_grad;
  const size_t bytes = static_cast<size_t>(bk.flat.numel()) * bk.flat.element_size();
  if (pool_)
    pool_->allocate(bk.flat, bytes);
  else
    allocate_storage(bk.flat, bytes);
  bk.flat.zero_();
  bk.flat_dl = sdk::DLView(bk.flat);  // same DLTensor address, the new data pointer
}

void BucketManager::release_unit_grads() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  for (size_t b = 0; b < buckets_.size(); ++b) release_unit_grad(b);
}

void BucketManager::release_unit_grad(size_t b) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  Bucket& bk = buckets_.at(b);
  if (bk.unit < 0 || !allocated(bk)) return;
  for (size_t i : bk.params) params_[i].tensor.mutable_grad() = at::Tensor();
  if (pool_)
    pool_->release(bk.flat);
  else
    free_storage(bk.flat);
}

void BucketManager::on_grad_ready(size_t i) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (!attached_) return;
  Param& p = params_[i];
  Bucket& bk = buckets_[static_cast<size_t>(p.bucket)];
  if (bk.unit >= 0 && !no_sync_ && next_ > 0 && unit_alloc_ && !allocated(bk)) unit_alloc_(next_);
  ensure_allocated(bk);
  struct UnitGrad {  // told after the gradient is in the bucket, whatever path returns
    BucketManager& m;
    const Bucket& bk;
    size_t i;
    ~UnitGrad() {
      if (bk.unit >= 0 && m.unit_grad_) m.unit_grad_(i);
    }
  } told{*this, bk, i};
  if (no_sync_) {
    if (bk.launched)
      throw Error("parameter '" + p.name + "' got a gradient under no_sync() after its bucket " +
                  std::to_string(p.bucket) +
                  " was already sent for reduction: call step() before accumulating again");
    ensure_view(p);  // accumulated in place into the bucket view; sent later
    p.accumulated = true;
    return;
  }
  if (p.ready) {
    if (bk.launched)
      throw Error("parameter '" + p.name + "' got a second gradient after its bucket " +
                  std::to_string(p.bucket) +
                  " was already sent for reduction: call step() between backward passes");
    ensure_view(p);  // accumulating twice before launch is harmless
    return;
  }
  ensure_view(p);
  p.ready = true;
  if (--bk.pending == 0 && opts_.overlap) launch_in_order_locked();
}

void BucketManager::launch_in_order_locked() {
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) launch_locked(next_);
}

void BucketManager::launch_locked(size_t b) {
  Bucket& bk = buckets_[b];
  bk.launched = true;
  next_ = b + 1;
  launch_(descs_[b]);
}

void BucketManager::finish() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  at::NoGradGuard no_grad;
  try {
    for (size_t b = next_; b < buckets_.size(); ++b) {
      Bucket& bk = buckets_[b];
      ensure_allocated(bk);  // a unit without any gradient this step: zeros
      for (size_t i : bk.params) {
        Param& p = params_[i];
        if (p.ready || p.accumulated) continue;
        if (rehook_if_replaced(i)) {
          ensure_view(p);  // the gradient is in .grad, the old hook just never saw it
        } else {
          // No gradient this step: contribute zeros (and keep .grad the view).
          p.view.zero_();
          if (!aliases(p.tensor.grad(), p.view)) p.tensor.mutable_grad() = p.view;
        }
      }
      bk.pending = 0;
      launch_locked(b);
    }
  } catch (...) {
    reset_step_locked();
    throw;
  }
  reset_step_locked();
}

void BucketManager::reset_step_locked() {
  for (auto& p : params_) p.ready = p.accumulated = false;
  for (auto& bk : buckets_) {
    bk.pending = bk.params.size();
    bk.launched = false;
  }
  next_ = 0;
}

void BucketManager::set_no_sync(bool on) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  no_sync_ = on;
}

bool BucketManager::no_sync() const {
  std::lock_guard<std::recursive_mutex> lk(const_cast<std::recursive_mutex&>(mu_));
  return no_sync_;
}

void BucketManager::zero_grad() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  if (next_ > 0)
    throw Error(
        "zero_grad() after a backward whose buckets are being reduced: call step() first (bucket " +
        std::to_string(next_ - 1) + " is in flight)");
  at::NoGradGuard no_grad;
  for (auto& bk : buckets_)
    if (allocated(bk)) bk.flat.zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (p.view.defined() && !aliases(p.tensor.grad(), p.view) &&
        allocated(buckets_[static_cast<size_t>(p.bucket)]))
      p.tensor.mutable_grad() = p.view;
    if (attached_) rehook_if_replaced(i);
  }
  reset_step_locked();
}

}  // namespace distopt::optim
