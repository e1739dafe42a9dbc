// Mixed precision as the job configures it: dtype names and types, the
// start-up check, and the loss scaler (torch.cuda.amp.GradScaler's update
// rule). The optimizer's fp32 masters are in optim/master_weights.cpp.
#include "distopt/precision.hpp"

#include <ATen/Context.h>

#include <algorithm>
#include <cmath>

#include "base/yaml_util.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"

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
      yaml::location(cfg.path, cfg.precision_mark) +
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

}  // namespace distopt
