// Mixed precision: the `precision:` section of a job and the dynamic loss
// scaler of the DistributedOptimizer.
//
// Semantics follow NVIDIA apex's FP16_Optimizer / mlbench's FP16Optimizer
// (fp32 master weights owned by the optimizer, low-precision model) and
// torch.cuda.amp.GradScaler's dynamic loss scale (scale the loss before
// backward, unscale the gradients, skip the step and back the scale off when
// a gradient is inf/NaN, grow it after `growth_interval` good steps).
// Torch-free (config.hpp includes it): c10::ScalarType is only declared.
#pragma once

#include <cstdint>
#include <string>

namespace c10 {
enum class ScalarType : int8_t;  // <c10/core/ScalarType.h>
}

namespace distopt {

/// The dtype the model computes in.
enum class PrecisionDtype { fp32, bf16, fp16 };

/// "fp32" | "bf16" | "fp16".
const char* precision_dtype_name(PrecisionDtype d);
/// at::kFloat | at::kBFloat16 | at::kHalf.
c10::ScalarType precision_scalar_type(PrecisionDtype d);

/// `precision:` of the job YAML (config.hpp parses it; every key optional):
///
/// ```yaml
/// precision:
///   dtype: bf16            # bf16 | fp16 | fp32 (default fp32)
///   master_weights: fp32   # the only choice: the optimizer keeps fp32 masters
///   loss_scale: dynamic    # dynamic | a number > 0 (static scale)
///   init_scale: 65536      # dynamic: first scale, > 0
///   growth_factor: 2       # dynamic: x this after growth_interval good steps, > 1
///   backoff_factor: 0.5    # dynamic: x this after a step with inf/NaN, in (0, 1)
///   growth_interval: 2000  # dynamic: consecutive good steps before growing, >= 1
///   min_scale: 1           # dynamic: the scale never backs off below this, > 0, <= init_scale
/// ```
///
/// Absent section, or dtype fp32 without loss_scale: mixed precision is off
/// and the optimizer behaves exactly as without the section. dtype fp32 with
/// an explicit loss_scale keeps fp32 parameters but scales the loss and skips
/// non-finite steps (a debugging aid). fp16 needs a CUDA device (libtorch has
/// no CPU half-precision matmul kernels); bf16 runs on CPU.
struct PrecisionConfig {
  PrecisionDtype dtype = PrecisionDtype::fp32;
  bool loss_scale_set = false;  ///< `loss_scale` was written in the file
  bool dynamic = true;          ///< loss_scale: dynamic
  double static_scale = 1;      ///< loss_scale: <number> (when !dynamic)
  double init_scale = 65536;
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1;

  /// True when the optimizer keeps masters / scales the loss (see above).
  bool enabled() const { return dtype != PrecisionDtype::fp32 || loss_scale_set; }
  /// The scale a fresh optimizer starts with.
  double initial_scale() const { return dynamic ? init_scale : static_scale; }
};

struct JobConfig;

/// Throws ConfigError "FILE:LINE:COL: precision.dtype: fp16 needs a GPU ...;
/// use dtype: bf16, which runs on CPU" when the job asks for fp16 and there
/// is no CUDA device, or `cpu_only` (the caller runs its model on the CPU,
/// as `distopt train` does): libtorch has no CPU half-precision matmul.
/// Runtime::from_config calls it before the rendezvous. Thread-safe.
void check_precision_supported(const JobConfig& cfg, bool cpu_only = false);

/// The whole state of a loss scaler: what a checkpoint saves and restores
/// (checkpoints store it beside the optimizer state). Plain values.
struct LossScaleState {
  double scale = 1;            ///< the current loss scale
  int64_t growth_tracker = 0;  ///< consecutive good steps since the last change
  int64_t skipped_steps = 0;   ///< steps skipped for inf/NaN since creation
};

/// torch.cuda.amp.GradScaler's update rule (`_amp_update_scale_`), plus
/// apex's min_loss_scale floor. Dynamic: after a step with a non-finite
/// gradient, scale = max(scale x backoff_factor, min_scale) and the tracker
/// resets; after growth_interval consecutive good steps, scale x
/// growth_factor (only if that stays finite) and the tracker resets. Static:
/// the scale never changes, non-finite steps are still skipped and counted.
/// Not thread-safe (one per optimizer, used from the training thread).
class LossScaler {
 public:
  explicit LossScaler(const PrecisionConfig& cfg);

  double scale() const { return state_.scale; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  /// Record the outcome of one step (found_inf: it was skipped).
  void update(bool found_inf);

  const LossScaleState& state() const { return state_; }
  /// Restore a saved state. Throws distopt::Error for a scale that is not
  /// finite and > 0, or negative counters.
  void set_state(const LossScaleState& s);

 private:
  PrecisionConfig cfg_;
  LossScaleState state_;
};

}  // namespace distopt
