// Parsing of optimizer.lr_schedule and optimizer.grad_clip (lr_schedule_config.hpp).
#include "config/lr_schedule_config.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/yaml_util.hpp"
#include "distopt/algorithm.h"
#include "distopt/error.hpp"

namespace distopt::config {
namespace {

using namespace yaml;

const std::string kPath = "optimizer.lr_schedule";

// Keys each kind accepts besides `name` (alias `kind`).
std::vector<std::string> keys_of(LrScheduleKind k) {
  const std::vector<std::string> warmup = {"warmup_steps", "warmup_start_factor"};
  auto with_warmup = [&](std::vector<std::string> v) {
    v.insert(v.end(), warmup.begin(), warmup.end());
    return v;
  };
  switch (k) {
    case LrScheduleKind::constant:
      return {};
    case LrScheduleKind::step:
      return with_warmup({"step_size", "gamma"});
    case LrScheduleKind::multi_step:
      return with_warmup({"milestones", "gamma"});
    case LrScheduleKind::cosine:
      return with_warmup({"total_steps", "min_lr_factor"});
    case LrScheduleKind::linear:
      return with_warmup({"total_steps", "end_factor"});
    case LrScheduleKind::one_cycle:
      return {"total_steps", "pct_start", "div_factor", "final_div_factor", "anneal"};
  }
  return {};
}

LrScheduleKind kind_of(const YAML::Node& n, const std::string& file) {
  const auto v = to_string(n);
  if (!v || n.IsNull() || !n.IsScalar())
    fail(file, mark_of(n), kPath + ".name: expected a name, got " + describe(n));
  const auto& names = lr_schedule_kind_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == *v) return static_cast<LrScheduleKind>(i);
  std::string msg = kPath + ".name: unknown schedule '" + *v + "'; valid: " + join(names);
  if (const std::string best = closest_match(*v, names); !best.empty())
    msg += " (did you mean '" + best + "'?)";
  fail(file, mark_of(n), msg);
}

}  // namespace

LrSchedule parse_lr_schedule(const YAML::Node& node, const std::string& file) {
  LrSchedule s;
  if (node.IsScalar()) {  // `lr_schedule: cosine`
    s.kind = kind_of(node, file);
    return s;
  }
  if (!node.IsMap())
    fail(file, mark_of(node), kPath + ": expected a kind name or a map, got " + describe(node));
  // `name:` as every other section names its choice; `kind:` (the older
  // spelling) is kept as its alias.
  const YAML::Node name = node["name"], kind = node["kind"];
  if (name.IsDefined() && kind.IsDefined())
    fail(file, mark_of(kind), kPath + ": give 'name' or its alias 'kind', not both");
  if (!name.IsDefined() && !kind.IsDefined())
    fail(file, mark_of(node), kPath + ": missing required key 'name'");
  s.kind = kind_of(name.IsDefined() ? name : kind, file);
  const std::vector<std::string> valid = keys_of(s.kind);
  for (const auto& kv : node) {
    const YAML::Node k = kv.first, v = kv.second;
    if (!k.IsScalar()) fail(file, mark_of(k), kPath + ": keys must be strings, got " + describe(k));
    const std::string& key = k.Scalar();
    const std::string path = kPath + "." + key;
    if (key == "kind" || key == "name") continue;
    if (std::find(valid.begin(), valid.end(), key) == valid.end()) {
      std::vector<std::string> all = valid;
      all.insert(all.begin(), "name");
      fail(file, mark_of(k),
           unknown_key_message(key, kPath + " (kind " + lr_schedule_kind_name(s.kind) + ")", all));
    }
    auto integer = [&](int64_t lo) {
      const auto x = to_int(v);
      if (!x || *x < lo)
        fail(file, mark_of(v, mark_of(k)),
             path + ": expected an integer >= " + std::to_string(lo) + ", got " + describe(v));
      return *x;
    };
    auto number = [&]() {
      const auto x = to_double(v);
      if (!x || !std::isfinite(*x))
        fail(file, mark_of(v, mark_of(k)), path + ": expected a number, got " + describe(v));
      return *x;
    };
    {
      if (key == "warmup_steps")
        s.warmup_steps = integer(0);
      else if (key == "warmup_start_factor")
        s.warmup_start_factor = number();
      else if (key == "step_size")
        s.step_size = integer(1);
      else if (key == "gamma")
        s.gamma = number();
      else if (key == "total_steps")
        s.total_steps = integer(1);
      else if (key == "min_lr_factor")
        s.min_lr_factor = number();
      else if (key == "end_factor")
        s.end_factor = number();
      else if (key == "pct_start")
        s.pct_start = number();
      else if (key == "div_factor")
        s.div_factor = number();
      else if (key == "final_div_factor")
        s.final_div_factor = number();
      else if (key == "anneal") {
        const auto a = to_string(v);
        if (!a || (*a != "cos" && *a != "linear"))
          fail(file, mark_of(v, mark_of(k)), path + ": expected cos or linear, got " + describe(v));
        s.anneal_cos = *a == "cos";
      } else if (key == "milestones") {
        if (!v.IsSequence())
          fail(file, mark_of(v, mark_of(k)),
               path + ": expected increasing positive integers, got " + describe(v));
        for (const auto& e : v) {
          const auto x = to_int(e);
          if (!x || *x <= 0 || (!s.milestones.empty() && *x <= s.milestones.back()))
            fail(file, mark_of(e, mark_of(v)), path + ": expected increasing positive integers");
          s.milestones.push_back(*x);
        }
      }
    }
  }
  // Ranges that involve several keys (total_steps may still be missing:
  // distopt train fills it in, the C++ API refuses it in make_optimizer).
  try {
    LrSchedule probe = s;
    if (probe.needs_total_steps() && probe.total_steps < 0)
      probe.total_steps = probe.warmup_steps + (int64_t(1) << 30);
    probe.validate();
  } catch (const ConfigError& e) {
    // At the key the message names ("optimizer.lr_schedule.KEY: ...").
    const std::string msg = e.what();
    const std::string key = msg.substr(kPath.size() + 1, msg.find(':') - kPath.size() - 1);
    YAML::Mark m = mark_of(node);
    for (const auto& kv : node)
      if (kv.first.IsScalar() && kv.first.Scalar() == key) m = mark_of(kv.first, m);
    fail(file, m, msg);
  }
  return s;
}

void check_grad_clip_support(const JobConfig& cfg, const ComponentInfo& algorithm) {
  if (cfg.grad_clip <= 0) return;
  const auto* vt = static_cast<const dopt_algorithm_v1*>(algorithm.vtable);
  if (vt && DOPT_HAS_FIELD(vt, dopt_algorithm_v1, set_grad_clip) && vt->set_grad_clip) return;
  YAML::Mark m = cfg.optimizer_mark;
  const YAML::Node opt = cfg.root.IsMap() ? cfg.root["optimizer"] : YAML::Node();
  if (opt.IsDefined() && opt.IsMap())
    for (const auto& kv : opt)
      if (kv.first.IsScalar() && kv.first.Scalar() == "grad_clip") m = mark_of(kv.first, m);
  fail(cfg.path, m,
       "optimizer.grad_clip: algorithm '" + algorithm.name + "' (plugin " + algorithm.file +
           ") cannot clip gradients: it was built for ABI " + std::to_string(algorithm.abi_major) +
           "." + std::to_string(algorithm.abi_minor) +
           " without set_grad_clip (ABI 1.5, algorithm.h); remove grad_clip or rebuild the "
           "plugin against distopt >= ABI 1.5");
}

}  // namespace distopt::config
