// Private: the host keys of `optimizer:` that are not the inner optimizer's
// options (lr_schedule, grad_clip), parsed apart from config.cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "distopt/config.hpp"
#include "distopt/lr_schedule.hpp"
#include "distopt/registry.hpp"

namespace distopt::config {

/// `optimizer.lr_schedule`: a kind name (`cosine`) or a map with `kind` and
/// that kind's keys. Throws ConfigError "FILE:LINE:COL: optimizer.lr_schedule.KEY:
/// ..." for an unknown kind or key (with 'did you mean'), a wrong type or a
/// value out of range. total_steps may be absent (distopt train fills it in).
LrSchedule parse_lr_schedule(const YAML::Node& node, const std::string& file);

/// With cfg.grad_clip > 0: throws ConfigError at optimizer.grad_clip's line
/// naming the algorithm and its plugin file when its vtable has no ABI 1.5
/// set_grad_clip (so distopt check refuses what train would).
void check_grad_clip_support(const JobConfig& cfg, const ComponentInfo& algorithm);

}  // namespace distopt::config
