// The keys of every section of the job's YAML file that the host itself
// validates (not the components' `options:`, which each plugin declares).
// One table per section: the parser takes its accepted key names from it
// (core/src/config/config.cpp) and `distopt config reference` prints it, so
// the reference cannot list a key the parser refuses or miss one it accepts.
#pragma once

#include <string>
#include <vector>

namespace distopt {

/// One key of a section. All strings are static, UTF-8, never null ("" for
/// none). `range` uses the interval notation of the option schemas
/// ("[1, 1048576]", "(0, 1]", "[0, inf)") for numbers, '|'-separated values
/// for a choice; `default_value` is the value in effect when the key is
/// absent, as YAML text or a phrase in parentheses ("(every default)").
struct KeySpec {
  const char* key;
  const char* type;  ///< "int", "double", "bool", "string", "map", "list", ...
  const char* default_value;
  const char* range;
  const char* help;  ///< one line
};

/// One section: `path` as error messages name it ("world", "train.synthetic",
/// "reducer.inner", "schedule[k]", "the top level").
struct SectionSchema {
  const char* path;
  const char* summary;  ///< one line: what the section is for
  std::vector<KeySpec> keys;
};

/// Every section the host validates, in the order of the reference. The
/// optimizer's keys other than `name` are per optimizer
/// (sdk/include/distopt/sdk/optim/optimizer_schema.hpp) and components' options
/// are the plugins' own: neither is in here. Thread-safe (built once).
const std::vector<SectionSchema>& config_sections();

/// The section at `path`; throws std::logic_error for a path not in
/// config_sections() (a programming error, never a user's).
const SectionSchema& config_section(const std::string& path);

/// The key names of section `path`, in table order (what check_keys accepts
/// and lists as "valid keys"); throws std::logic_error as config_section.
std::vector<std::string> config_keys(const std::string& path);

}  // namespace distopt
