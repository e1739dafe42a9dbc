// Learning-rate schedules (the job's optimizer.lr_schedule), applied by the
// host to every algorithm: a multiplicative factor f(step) of each parameter
// group's base learning rate, as torch.optim.lr_scheduler.LambdaLR.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distopt {

/// The kinds, named as PyTorch's schedulers (snake_case).
enum class LrScheduleKind {
  constant,    ///< f = 1
  step,        ///< StepLR: gamma^floor(s / step_size)
  multi_step,  ///< MultiStepLR: gamma^(number of milestones <= s)
  cosine,      ///< CosineAnnealingLR without restarts, to min_lr_factor
  linear,      ///< LinearLR from 1 to end_factor
  one_cycle,   ///< OneCycleLR (two phases), without momentum cycling
};

/// One schedule: its kind and the parameters of that kind (the others are
/// ignored). Units are optimizer steps (DistributedOptimizer::steps(): skipped
/// mixed-precision steps do not count). Plain value; copyable.
///
/// With warmup_steps = W > 0 (step, multi_step, cosine, linear), steps
/// 0 .. W-1 are a linear warm-up f = a + (1 - a) * step / W with
/// a = warmup_start_factor (default 0, as Hugging Face's
/// get_{cosine,linear}_schedule_with_warmup; PyTorch's
/// SequentialLR(LinearLR(start_factor=a, total_iters=W), main, [W]) for
/// a > 0), then the main schedule runs at s = step - W (so milestones and
/// step_size count from the end of the warm-up, as in SequentialLR) over
/// total_steps - W steps. Without warm-up s = step.
///
/// Formulas (T = total_steps - W; s clamped to T where noted):
///   step:       gamma^floor(s / step_size)
///   multi_step: gamma^|{m in milestones : m <= s}|
///   cosine:     m + (1 - m) * (1 + cos(pi * min(s, T) / T)) / 2, m = min_lr_factor
///               (CosineAnnealingLR's closed form with eta_min = m * base;
///               held at m after T instead of rising again)
///   linear:     1 + (end_factor - 1) * min(s, T) / T (LinearLR, start_factor 1)
///   one_cycle:  the group's lr is the peak (max_lr); with p = pct_start * T - 1,
///               initial = 1 / div_factor, final = initial / final_div_factor:
///               anneal(initial, 1, step / p) up to p, then
///               anneal(1, final, (step - p) / (T - 1 - p)) up to T - 1, final after;
///               anneal cos: e + (s - e) * (1 + cos(pi * x)) / 2, linear: s + (e - s) * x
///               (OneCycleLR with three_phase false; momentum is not cycled)
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  int64_t warmup_steps = 0;         ///< step, multi_step, cosine, linear
  double warmup_start_factor = 0;   ///< [0, 1]: the factor at step 0 of the warm-up
  int64_t step_size = 1;            ///< step: steps per decay (>= 1)
  double gamma = 0.1;               ///< step, multi_step: decay factor (> 0)
  std::vector<int64_t> milestones;  ///< multi_step: strictly increasing, > 0
  /// cosine, linear, one_cycle: the steps of the whole schedule (warm-up
  /// included); -1 = not given (`distopt train` fills it in from its
  /// epochs x steps per epoch or train.max_steps).
  int64_t total_steps = -1;
  double min_lr_factor = 0;       ///< cosine: the final factor, [0, 1]
  double end_factor = 0;          ///< linear: the final factor, [0, 1]
  double pct_start = 0.3;         ///< one_cycle: fraction of steps rising, (0, 1)
  double div_factor = 25;         ///< one_cycle: peak / initial (> 0)
  double final_div_factor = 1e4;  ///< one_cycle: initial / final (> 0)
  bool anneal_cos = true;         ///< one_cycle: anneal strategy cos (true) or linear

  /// The factor of the base learning rate at optimizer step `step` (>= 0;
  /// step 0 is the first step). Throws ConfigError as validate() does.
  double factor(int64_t step) const;
  /// Whether this kind needs total_steps.
  bool needs_total_steps() const;
  /// Throws ConfigError naming the key (`optimizer.lr_schedule.gamma: ...`)
  /// for a value out of range, or total_steps missing (-1) where the kind
  /// needs it or not above warmup_steps.
  void validate() const;
  /// "cosine(total_steps 1000, warmup_steps 100, min_lr_factor 0)": for logs.
  std::string describe() const;
};

/// "constant", "step", "multi_step", "cosine", "linear", "one_cycle".
const char* lr_schedule_kind_name(LrScheduleKind kind);
/// Every kind's name, in the order above.
const std::vector<std::string>& lr_schedule_kind_names();

}  // namespace distopt
