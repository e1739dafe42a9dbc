// Private: the ABI 1.2 job check. After validate_job has checked every
// section against the schemas, each selected component that has a
// check_job (dopt_component, distopt/job.h) sees the whole job and may
// refuse it; a refusal is a ConfigError at the YAML key it names.
#pragma once

#include <string>
#include <vector>

#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/registry.hpp"

namespace distopt::config {

/// One selected component with its validated options and the schema they
/// were validated against (a reducer's includes core's bucket options).
struct CheckedComponent {
  const ComponentInfo* info;
  const Options* options;
  const std::vector<OptionSpec>* schema;
};

/// Ask communicator, reducer, then algorithm (those with a check_job). The
/// first refusal throws ConfigError "FILE:LINE:COLUMN: KEY: KIND 'NAME'
/// refuses this job: MESSAGE" at the value of KEY if the file writes it, else
/// at the closest enclosing section it writes, else naming the file only.
void check_job_with_components(const JobConfig& cfg, int64_t world_size,
                               const CheckedComponent& communicator,
                               const CheckedComponent& reducer, const CheckedComponent& algorithm,
                               const Options& optimizer_options,
                               const std::vector<OptionSpec>& optimizer_schema);

/// Where the dotted `key` ("algorithm.options.stage") is written in the job:
/// its value's mark when present and a scalar, the key's own mark when it is
/// a section, else the mark of the deepest enclosing key the file writes;
/// a null mark when not even the first part is written.
YAML::Mark mark_of_key(const YAML::Node& root, const std::string& key);

}  // namespace distopt::config
