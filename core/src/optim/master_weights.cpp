// Mixed precision in the optimizer: the fp32 master weights and buckets of
// the DistributedOptimizer (the loss scaler is in config/precision.cpp).
#include "optim/master_weights.hpp"

#include <ATen/core/grad_mode.h>

#include "distopt/precision.hpp"

namespace distopt {

namespace optim {

MasterWeights::MasterWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                             const BucketManager& lp,
                             const std::map<std::string, at::Tensor>* initial) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i].second.detach();
    params_.push_back(p);
    const bool low =
        p.is_floating_point() && p.scalar_type() != at::kFloat && p.scalar_type() != at::kDouble;
    if (!low) {
      masters_.push_back(p);
      continue;
    }
    const at::Tensor* given = nullptr;
    if (initial) {
      auto it = initial->find(params[i].first);
      if (it != initial->end() && it->second.numel() == p.numel()) given = &it->second;
    }
    masters_.push_back(given ? given->to(p.device(), at::kFloat, false, /*copy=*/true)
                                   .reshape(p.sizes())
                                   .contiguous()
                             : p.to(at::kFloat).contiguous());
  }
  grads_.resize(params.size());
  const dopt_bucket* lp_descs = lp.buckets();
  descs_.resize(lp.num_buckets());
  for (size_t b = 0; b < lp.num_buckets(); ++b) {
    const at::Tensor& lf = lp.flat(b);
    lp_flats_.push_back(lf);
    const bool own = lf.scalar_type() != at::kFloat && lf.scalar_type() != at::kDouble;
    const bool unit = lp.unit_of_bucket(b) >= 0;
    const auto fp32 = lf.options().dtype(at::kFloat);
    flats_.push_back(!own ? lf : unit ? at::empty(lf.sizes(), fp32) : at::zeros(lf.sizes(), fp32));
    flat_dl_.emplace_back(flats_.back());
    dopt_bucket& d = descs_[b];
    d = lp_descs[b];  // same index and entries (offsets in elements, shapes)
    d.flat = flat_dl_.back().get();
    for (size_t e = 0; e < d.num_entries; ++e) {
      const dopt_bucket_entry& en = d.entries[e];
      const size_t i = static_cast<size_t>(en.param_index);
      grads_.at(i) = flats_.back()
                         .narrow(0, static_cast<int64_t>(en.offset), static_cast<int64_t>(en.numel))
                         .view(masters_[i].sizes());
    }
    // A unit's fp32 bucket gets memory only while a step needs it
    // (unscale_bucket to release_bucket): none from now on, as the
    // BucketManager's unit buckets (the views and descriptor keep shapes).
    if (own && unit) free_storage(flats_.back());
  }
}

uint64_t MasterWeights::bucket_bytes(size_t b) const {
  const auto& f = flats_.at(b);
  return static_cast<uint64_t>(f.numel()) * f.element_size();
}

namespace {

/// A bool scalar on t's device: whether t holds an inf or a NaN. Through
/// its min and max (both NaN when any element is; an inf is one of them):
/// at::isfinite(t) would take |t| and masks of t's size, a whole unit's
/// gradient again under parameter sharding.
at::Tensor non_finite(const at::Tensor& t) {
  if (t.numel() == 0) return at::zeros({}, t.options().dtype(at::kBool));
  auto [lo, hi] = at::aminmax(t);
  return at::logical_not(at::logical_and(at::isfinite(lo), at::isfinite(hi)));
}

}  // namespace

bool MasterWeights::unscale_grads(double scale) {
  at::NoGradGuard no_grad;
  bool found_inf = false;
  for (size_t b = 0; b < flats_.size(); ++b) {
    if (!flats_[b].is_same(lp_flats_[b])) flats_[b].copy_(lp_flats_[b]);
    // Division in fp32 (not in the low dtype): exact for a power-of-two scale.
    if (scale != 1.0) flats_[b].div_(scale);
    if (!found_inf && non_finite(flats_[b]).item<bool>()) found_inf = true;
  }
  return found_inf;
}

void MasterWeights::copy_to_model() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)
    if (masters_[i].defined() && !masters_[i].is_same(params_[i])) params_[i].copy_(masters_[i]);
}

void MasterWeights::shard_buckets(const std::vector<bool>& sharded,
                                  std::shared_ptr<StoragePool> pool) {
  sharded_ = sharded;
  sharded_.resize(flats_.size(), false);
  pool_ = std::move(pool);
}

void MasterWeights::unscale_bucket(size_t b, double scale) {
  at::NoGradGuard no_grad;
  at::Tensor& f = flats_.at(b);
  if (!aliases_model_bucket(b)) {
    if (b < sharded_.size() && sharded_[b]) {
      pool_->allocate(f, static_cast<size_t>(f.numel()) * f.element_size());
    }
    f.copy_(lp_flats_[b]);
  }
  // The low-precision manager may have given the bucket new memory: point
  // the descriptor at it (the DLTensor keeps its address).
  flat_dl_[b] = sdk::DLView(f);
  if (scale != 1.0) f.div_(scale);
  at::Tensor bad = non_finite(f);
  found_inf_ = found_inf_.defined() ? found_inf_.logical_or(bad) : bad;
}

bool MasterWeights::take_found_inf() {
  if (!found_inf_.defined()) return false;
  const bool found = found_inf_.item<bool>();
  found_inf_ = at::Tensor();
  return found;
}

void MasterWeights::release_bucket(size_t b) {
  if (b >= sharded_.size() || !sharded_[b] || aliases_model_bucket(b)) return;
  pool_->release(flats_[b]);
}

}  // namespace optim
}  // namespace distopt
