// Mixed precision: dtype helpers, the loss scaler (GradScaler's update rule)
// and the fp32 master weights / buckets of the DistributedOptimizer.
#include "distopt/precision.hpp"

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "config/yaml_util.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "optim/precision.hpp"

namespace distopt {

const char* precision_dtype_name(PrecisionDtype d) {
  switch (d) {
    case PrecisionDtype::bf16:
      return "bf16";
    case PrecisionDtype::fp16:
      return "fp16";
    case PrecisionDtype::fp32:
      break;
  }
  return "fp32";
}

c10::ScalarType precision_scalar_type(PrecisionDtype d) {
  switch (d) {
    case PrecisionDtype::bf16:
      return c10::ScalarType::BFloat16;
    case PrecisionDtype::fp16:
      return c10::ScalarType::Half;
    case PrecisionDtype::fp32:
      break;
  }
  return c10::ScalarType::Float;
}

void check_precision_supported(const JobConfig& cfg, bool cpu_only) {
  // libtorch 1.13 has no CPU kernels for half-precision matmul ("addmm_impl_cpu_
  // not implemented for 'Half'"): fail at start, not at the first forward.
  if (cfg.precision.dtype != PrecisionDtype::fp16) return;
  const bool cuda = at::hasCUDA();
  if (cuda && !cpu_only) return;
  throw ConfigError(
      yamlutil::location(cfg.path, cfg.precision_mark) +
      ": precision.dtype: fp16 needs a GPU (a CUDA device): libtorch has no CPU half-precision "
      "matmul kernels, and " +
      (cuda ? std::string("this program runs its model on the CPU")
            : std::string("no CUDA device is available here")) +
      "; use dtype: bf16, which runs on CPU");
}

LossScaler::LossScaler(const PrecisionConfig& cfg) : cfg_(cfg) {
  state_.scale = cfg.initial_scale();
}

void LossScaler::update(bool found_inf) {
  if (found_inf) ++state_.skipped_steps;
  if (!cfg_.dynamic) return;
  if (found_inf) {
    state_.scale = std::max(state_.scale * cfg_.backoff_factor, cfg_.min_scale);
    state_.growth_tracker = 0;
    return;
  }
  if (++state_.growth_tracker < cfg_.growth_interval) return;
  const double grown = state_.scale * cfg_.growth_factor;
  if (std::isfinite(grown)) state_.scale = grown;  // GradScaler never grows into inf
  state_.growth_tracker = 0;
}

void LossScaler::set_state(const LossScaleState& s) {
  if (!(std::isfinite(s.scale) && s.scale > 0))
    throw Error("loss scale state: scale " + std::to_string(s.scale) +
                " is not a finite number > 0");
  if (s.growth_tracker < 0 || s.skipped_steps < 0)
    throw Error("loss scale state: negative growth_tracker or skipped_steps");
  state_ = s;
}

namespace optim {

MasterWeights::MasterWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                             const BucketManager& lp) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i].second.detach();
    params_.push_back(p);
    const bool low =
        p.is_floating_point() && p.scalar_type() != at::kFloat && p.scalar_type() != at::kDouble;
    masters_.push_back(low ? p.to(at::kFloat).contiguous() : p);
  }
  grads_.resize(params.size());
  const dopt_bucket* lp_descs = lp.buckets();
  descs_.resize(lp.num_buckets());
  for (size_t b = 0; b < lp.num_buckets(); ++b) {
    const at::Tensor& lf = lp.flat(b);
    lp_flats_.push_back(lf);
    flats_.push_back(lf.scalar_type() == at::kFloat || lf.scalar_type() == at::kDouble
                         ? lf
                         : at::zeros(lf.sizes(), lf.options().dtype(at::kFloat)));
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
  }
}

uint64_t MasterWeights::bucket_bytes(size_t b) const {
  const auto& f = flats_.at(b);
  return static_cast<uint64_t>(f.numel()) * f.element_size();
}

bool MasterWeights::unscale_grads(double scale) {
  at::NoGradGuard no_grad;
  bool found_inf = false;
  for (size_t b = 0; b < flats_.size(); ++b) {
    if (!flats_[b].is_same(lp_flats_[b])) flats_[b].copy_(lp_flats_[b]);
    // Division in fp32 (not in the low dtype): exact for a power-of-two scale.
    if (scale != 1.0) flats_[b].div_(scale);
    if (!found_inf && !at::isfinite(flats_[b]).all().item<bool>()) found_inf = true;
  }
  return found_inf;
}

void MasterWeights::copy_to_model() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!masters_[i].is_same(params_[i])) params_[i].copy_(masters_[i]);
}

}  // namespace optim
}  // namespace distopt
