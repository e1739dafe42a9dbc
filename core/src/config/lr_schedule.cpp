// LrSchedule: the closed forms of PyTorch's schedulers (lr_schedule.hpp).
#include "distopt/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "distopt/error.hpp"

namespace distopt {
namespace {

constexpr double kPi = 3.14159265358979323846;

[[noreturn]] void bad(const std::string& key, const std::string& why) {
  throw ConfigError("optimizer.lr_schedule." + key + ": " + why);
}

// OneCycleLR's _annealing_cos / _annealing_linear.
double anneal(bool cos, double start, double end, double pct) {
  if (cos) return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1);
  return (end - start) * pct + start;
}

bool has_warmup(LrScheduleKind k) {
  return k == LrScheduleKind::step || k == LrScheduleKind::multi_step ||
         k == LrScheduleKind::cosine || k == LrScheduleKind::linear;
}

}  // namespace

const std::vector<std::string>& lr_schedule_kind_names() {
  static const std::vector<std::string> names = {"constant", "step",   "multi_step",
                                                 "cosine",   "linear", "one_cycle"};
  return names;
}

const char* lr_schedule_kind_name(LrScheduleKind kind) {
  return lr_schedule_kind_names()[static_cast<size_t>(kind)].c_str();
}

bool LrSchedule::needs_total_steps() const {
  return kind == LrScheduleKind::cosine || kind == LrScheduleKind::linear ||
         kind == LrScheduleKind::one_cycle;
}

void LrSchedule::validate() const {
  auto unit = [](double v) { return std::isfinite(v) && v >= 0 && v <= 1; };
  if (warmup_steps < 0) bad("warmup_steps", "expected an integer >= 0");
  if (warmup_steps > 0 && !has_warmup(kind))
    bad("warmup_steps", std::string("kind '") + lr_schedule_kind_name(kind) +
                            "' has no warm-up (one_cycle warms up by itself: pct_start)");
  if (!unit(warmup_start_factor)) bad("warmup_start_factor", "expected a value in [0, 1]");
  if (needs_total_steps()) {
    if (total_steps < 0)
      bad("total_steps", std::string("required for kind '") + lr_schedule_kind_name(kind) +
                             "' (distopt train fills it in from train.epochs x steps per epoch; "
                             "the C++ API needs it in the job or in set_lr_schedule)");
    if (total_steps <= warmup_steps)
      bad("total_steps", "must be greater than warmup_steps (" + std::to_string(warmup_steps) +
                             "), got " + std::to_string(total_steps));
  }
  switch (kind) {
    case LrScheduleKind::constant:
      break;
    case LrScheduleKind::step:
      if (step_size < 1) bad("step_size", "expected an integer >= 1");
      if (!(gamma > 0) || !std::isfinite(gamma)) bad("gamma", "expected a finite value > 0");
      break;
    case LrScheduleKind::multi_step:
      if (!(gamma > 0) || !std::isfinite(gamma)) bad("gamma", "expected a finite value > 0");
      if (milestones.empty()) bad("milestones", "expected a non-empty list");
      for (size_t i = 0; i < milestones.size(); ++i)
        if (milestones[i] <= 0 || (i > 0 && milestones[i] <= milestones[i - 1]))
          bad("milestones", "expected increasing positive integers");
      break;
    case LrScheduleKind::cosine:
      if (!unit(min_lr_factor)) bad("min_lr_factor", "expected a value in [0, 1]");
      break;
    case LrScheduleKind::linear:
      if (!unit(end_factor)) bad("end_factor", "expected a value in [0, 1]");
      break;
    case LrScheduleKind::one_cycle:
      if (!(pct_start > 0 && pct_start < 1)) bad("pct_start", "expected a value in (0, 1)");
      if (!(div_factor > 0) || !std::isfinite(div_factor))
        bad("div_factor", "expected a finite value > 0");
      if (!(final_div_factor > 0) || !std::isfinite(final_div_factor))
        bad("final_div_factor", "expected a finite value > 0");
      if (pct_start * static_cast<double>(total_steps) <= 1)
        bad("pct_start", "pct_start x total_steps must exceed 1 (the rising phase needs 2 steps)");
      break;
  }
}

double LrSchedule::factor(int64_t step) const {
  validate();
  if (step < 0) step = 0;
  if (kind == LrScheduleKind::one_cycle) {
    // OneCycleLR.get_lr, three_phase false, lr relative to max_lr.
    const double initial = 1.0 / div_factor, last = initial / final_div_factor;
    const double end1 = pct_start * static_cast<double>(total_steps) - 1;
    const double end2 = static_cast<double>(total_steps) - 1;
    const double s = static_cast<double>(step);
    if (s <= end1) return anneal(anneal_cos, initial, 1.0, s / end1);
    if (s >= end2) return last;
    return anneal(anneal_cos, 1.0, last, (s - end1) / (end2 - end1));
  }
  if (kind == LrScheduleKind::constant) return 1.0;
  if (step < warmup_steps)
    return warmup_start_factor + (1 - warmup_start_factor) * static_cast<double>(step) /
                                     static_cast<double>(warmup_steps);
  const int64_t s = step - warmup_steps;
  switch (kind) {
    case LrScheduleKind::step:
      return std::pow(gamma, static_cast<double>(s / step_size));
    case LrScheduleKind::multi_step: {
      const auto passed =
          std::upper_bound(milestones.begin(), milestones.end(), s) - milestones.begin();
      return std::pow(gamma, static_cast<double>(passed));
    }
    case LrScheduleKind::cosine: {
      const double t = static_cast<double>(total_steps - warmup_steps);
      const double x = std::min(static_cast<double>(s), t) / t;
      return min_lr_factor + (1 - min_lr_factor) * (1 + std::cos(kPi * x)) / 2;
    }
    case LrScheduleKind::linear: {
      const double t = static_cast<double>(total_steps - warmup_steps);
      return 1 + (end_factor - 1) * std::min(static_cast<double>(s), t) / t;
    }
    default:
      return 1.0;
  }
}

std::string LrSchedule::describe() const {
  std::ostringstream os;
  os << lr_schedule_kind_name(kind) << "(";
  const char* sep = "";
  auto item = [&](const char* k, auto v) {
    os << sep << k << " " << v;
    sep = ", ";
  };
  if (needs_total_steps()) item("total_steps", total_steps);
  if (warmup_steps > 0) {
    item("warmup_steps", warmup_steps);
    item("warmup_start_factor", warmup_start_factor);
  }
  switch (kind) {
    case LrScheduleKind::step:
      item("step_size", step_size);
      item("gamma", gamma);
      break;
    case LrScheduleKind::multi_step: {
      std::string m = "[";
      for (size_t i = 0; i < milestones.size(); ++i)
        m += (i ? ", " : "") + std::to_string(milestones[i]);
      item("milestones", m + "]");
      item("gamma", gamma);
      break;
    }
    case LrScheduleKind::cosine:
      item("min_lr_factor", min_lr_factor);
      break;
    case LrScheduleKind::linear:
      item("end_factor", end_factor);
      break;
    case LrScheduleKind::one_cycle:
      item("pct_start", pct_start);
      item("div_factor", div_factor);
      item("final_div_factor", final_div_factor);
      item("anneal", anneal_cos ? "cos" : "linear");
      break;
    default:
      break;
  }
  os << ")";
  return os.str();
}

}  // namespace distopt
