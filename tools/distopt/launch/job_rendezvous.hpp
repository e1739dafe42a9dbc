// The job file's world.rendezvous, for the launcher's note that its own
// rendezvous replaces it (LaunchOptions::config_rendezvous).
#pragma once

#include <string>

#include "distopt/config.hpp"
#include "launch/launcher.hpp"

namespace distopt::launch {

/// Record `job`'s world.rendezvous (when the file sets one) in `lo`.
inline void note_job_rendezvous(const JobConfig& job, LaunchOptions& lo) {
  // `job` is const: a missing key is an invalid node (only IsDefined is safe on it).
  if (!job.root.IsMap()) return;
  const YAML::Node world = job.root["world"];
  if (!world.IsDefined() || !world.IsMap()) return;
  const YAML::Node r = world["rendezvous"];
  if (!r.IsDefined() || r.IsNull()) return;
  lo.config_rendezvous = job.rendezvous;
  lo.config_rendezvous_where = job.path + ":" + std::to_string(r.Mark().line + 1);
}

}  // namespace distopt::launch
