#include "optim/param_shards.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>

#include <utility>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "optim/storage.hpp"

namespace distopt::optim {

ParamShards::ParamShards(std::vector<UnitSpec> units, int32_t mode, const dopt_algorithm_v1* avt,
                         dopt_algorithm* alg, std::string who, std::shared_ptr<StoragePool> pool)
    : mode_(mode), avt_(avt), alg_(alg), who_(std::move(who)), pool_(std::move(pool)) {
  units_.resize(units.size());
  position_.assign(units.size(), -1);
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& x = units_[u];
    x.spec = std::move(units[u]);
    const at::Tensor& first = x.spec.members.at(0).tensor;
    const auto opts = first.options().requires_grad(false);
    x.full = at::empty({static_cast<int64_t>(x.spec.numel)}, opts);
    x.got_grad.assign(x.spec.members.size(), false);
    for (Member& m : x.spec.members) {
      m.shape.assign(m.tensor.sizes().begin(), m.tensor.sizes().end());
      x.placeholders.push_back(at::empty({0}, m.tensor.options().requires_grad(false)));
    }
  }
}

ParamShards::~ParamShards() {
  for (auto& s : slots_)
    if (s->hooks == this) s->hooks = nullptr;  // a rebuilt optimizer may hold them now
}

void ParamShards::attach(std::vector<std::shared_ptr<UnitSlot>> slots) {
  slots_ = std::move(slots);
  attach_again();
}

void ParamShards::attach_again() {
  for (size_t u = 0; u < slots_.size(); ++u) {
    slots_[u]->hooks = this;
    slots_[u]->unit = static_cast<int>(u);
  }
}

void ParamShards::check(dopt_status s, const std::string& what) const {
  if (s != DOPT_OK) throw ComponentError(s, who_, what, take_last_error());
}

void ParamShards::gather_locked(size_t u) {
  Unit& x = units_[u];
  if (x.state != State::freed) return;
  pool_->allocate(x.full, x.spec.numel * x.full.element_size());
  x.full_dl = sdk::DLView(x.full);
  x.state = State::pending;
  note_peak_locked();
  dopt_status s = avt_->gather_params(alg_, x.spec.bucket, x.full_dl.get());
  if (s != DOPT_OK) {
    x.state = State::freed;
    pool_->release(x.full);
    check(s, "gather_params(unit '" + x.spec.name + "')");
  }
}

void ParamShards::wait_locked(size_t u) {
  Unit& x = units_[u];
  gather_locked(u);
  if (x.state != State::pending) return;
  x.state = State::ready;  // even on failure: the request is gone
  check(avt_->wait_params(alg_, x.spec.bucket), "wait_params(unit '" + x.spec.name + "')");
  for (const Member& m : x.spec.members)
    m.tensor.set_data(
        x.full.narrow(0, static_cast<int64_t>(m.offset), c10::multiply_integers(m.shape))
            .view(m.shape));
}

void ParamShards::release_locked(size_t u) {
  Unit& x = units_[u];
  if (x.state == State::freed || x.pinned) return;
  if (x.state == State::pending) wait_locked(u);  // the gather still writes into it
  for (size_t k = 0; k < x.spec.members.size(); ++k)
    x.spec.members[k].tensor.set_data(x.placeholders[k]);
  x.full_dl = sdk::DLView();
  pool_->release(x.full);
  x.state = State::freed;
}

void ParamShards::prefetch_locked(size_t u, int direction) {
  const int p = position_[u];
  if (p < 0) return;
  const int next = p + direction;
  if (next < 0 || next >= static_cast<int>(order_.size())) return;
  gather_locked(order_[static_cast<size_t>(next)]);
}

void ParamShards::note_peak_locked() {
  uint64_t now = 0;
  for (const Unit& x : units_) now += storage_bytes(x.full);
  if (now > peak_) peak_ = now;
}

void ParamShards::before_forward(int unit) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto u = static_cast<size_t>(unit);
  if (at::GradMode::is_enabled()) seen_.push_back(u);
  wait_locked(u);
  prefetch_locked(u, +1);
}

void ParamShards::after_forward(int unit, const at::Tensor& output) {
  const auto u = static_cast<size_t>(unit);
  const bool backward_follows = output.defined() && output.requires_grad();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!backward_follows || mode_ == DOPT_PARAM_SHARDING_FULL) release_locked(u);
  }
  if (!backward_follows) return;
  std::weak_ptr<ParamShards> weak = weak_from_this();
  output.register_hook([weak, unit](const at::Tensor&) {
    if (auto self = weak.lock()) self->before_backward(unit);
  });
}

void ParamShards::before_backward(int unit) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto u = static_cast<size_t>(unit);
  if (!end_of_backward_queued_) {
    // Whatever a backward leaves gathered (no_sync, units without gradient)
    // goes when it ends.
    end_of_backward_queued_ = true;
    std::weak_ptr<ParamShards> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto self = weak.lock()) {
        std::lock_guard<std::mutex> lk2(self->mu_);
        self->end_of_backward_queued_ = false;
        for (size_t v = 0; v < self->units_.size(); ++v) {
          Unit& x = self->units_[v];
          x.got_grad.assign(x.got_grad.size(), false);
          x.grads = 0;
          self->release_locked(v);
        }
      }
    });
  }
  wait_locked(u);
  prefetch_locked(u, -1);
}

void ParamShards::grad_ready(int unit, size_t member) {
  std::lock_guard<std::mutex> lk(mu_);
  Unit& x = units_[static_cast<size_t>(unit)];
  if (x.got_grad[member]) return;
  x.got_grad[member] = true;
  if (++x.grads < x.spec.members.size()) return;
  x.got_grad.assign(x.got_grad.size(), false);
  x.grads = 0;
  release_locked(static_cast<size_t>(unit));
}

void ParamShards::end_step() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t u = 0; u < units_.size(); ++u) release_locked(u);
  if (seen_.empty()) return;
  order_.clear();
  position_.assign(units_.size(), -1);
  for (size_t u : seen_) {
    if (position_[u] >= 0) continue;  // a unit run twice: its first place
    position_[u] = static_cast<int>(order_.size());
    order_.push_back(u);
  }
  seen_.clear();
}

void ParamShards::gather_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t u = 0; u < units_.size(); ++u) gather_locked(u);
  for (size_t u = 0; u < units_.size(); ++u) {
    wait_locked(u);
    units_[u].pinned = true;
  }
}

void ParamShards::scatter_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (Unit& x : units_) {
    if (x.state != State::ready) throw Error("parameter sharding: scatter_all outside gather_all");
    const sdk::DLView view(x.full);
    check(avt_->scatter_params(alg_, x.spec.bucket, view.get()),
          "scatter_params(unit '" + x.spec.name + "')");
  }
}

void ParamShards::release_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].pinned = false;
    release_locked(u);
  }
}

void ParamShards::free_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& x = units_[u];
    x.pinned = false;
    x.state = State::ready;  // the parameters are whole now: point them away
    release_locked(u);
  }
  pool_->clear();
}

at::Tensor ParamShards::gather_copy(size_t u, at::ScalarType dtype) {
  std::lock_guard<std::mutex> lk(mu_);
  Unit& x = units_.at(u);
  if (x.state == State::pending) wait_locked(u);  // one gather of a bucket at a time
  at::Tensor full = at::empty({static_cast<int64_t>(x.spec.numel)}, x.full.options().dtype(dtype));
  sdk::DLView view(full);
  check(avt_->gather_params(alg_, x.spec.bucket, view.get()),
        "gather_params(unit '" + x.spec.name + "')");
  check(avt_->wait_params(alg_, x.spec.bucket), "wait_params(unit '" + x.spec.name + "')");
  return full;
}

void ParamShards::scatter_copy(size_t u, const at::Tensor& full) {
  std::lock_guard<std::mutex> lk(mu_);
  Unit& x = units_.at(u);
  const sdk::DLView view(full);
  check(avt_->scatter_params(alg_, x.spec.bucket, view.get()),
        "scatter_params(unit '" + x.spec.name + "')");
}

void ParamShards::unshard_locally() {
  std::lock_guard<std::mutex> lk(mu_);
  for (Unit& x : units_) {
    for (const Member& m : x.spec.members)
      m.tensor.set_data(at::zeros(m.shape, m.tensor.options().requires_grad(false)));
    x.pinned = false;
    x.full_dl = sdk::DLView();
    pool_->release(x.full);
    x.state = State::freed;
  }
  pool_->clear();
}

uint64_t ParamShards::gathered_bytes() const {
  uint64_t n = 0;
  for (const Unit& x : units_) n += storage_bytes(x.full);
  return n;
}

uint64_t ParamShards::take_peak_gathered_bytes() {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t p = peak_;
  peak_ = 0;
  note_peak_locked();
  return p;
}

}  // namespace distopt::optim
