// Component options: the C schema a plugin declares, and the validated values
// the host hands back through dopt_options.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "distopt/abi.h"

namespace distopt {

/// C++ copy of a dopt_option_spec.
struct OptionSpec {
  std::string name;
  dopt_option_type type = DOPT_OPTION_STRING;
  std::optional<std::string> default_value;  ///< YAML text; nullopt = required
  double min_value = 0, max_value = -1;      ///< range checked when min <= max
  std::vector<std::string> choices;          ///< STRING: allowed values (empty = any)
  std::string help;
};

/// "bool", "int", "double" or "string" (as shown to users); "unknown" for
/// a value outside the enum. Static lifetime, thread-safe.
const char* option_type_name(dopt_option_type type);

/// Copy n C specs, reading only the fields their struct_size covers.
std::vector<OptionSpec> specs_from_c(const dopt_option_spec* specs, size_t n);

/// One instance's validated options. Its address doubles as the opaque
/// dopt_options* handed to plugins (see c_handle / from_c). Immutable after
/// validate(); thread-safe to read.
class Options {
 public:
  using Value = std::variant<bool, int64_t, double, std::string>;

  /// Validate `node` (a YAML map, or null/undefined for "no options") against
  /// `schema`. `file` and `where` ("reducer.options") go into error messages.
  /// Throws ConfigError naming file:line:column and the key for: an unknown
  /// key (listing the valid keys), a wrong type, a value out of range or not
  /// among the choices, a missing required option.
  static Options validate(const YAML::Node& node, const std::vector<OptionSpec>& schema,
                          const std::string& file, const std::string& where);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  /// Typed access; throw ConfigError if absent or of another type.
  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_double(const std::string& name) const;  ///< also accepts an INT option
  const std::string& get_string(const std::string& name) const;
  const std::map<std::string, Value>& values() const { return values_; }

  const dopt_options* c_handle() const { return reinterpret_cast<const dopt_options*>(this); }
  static const Options* from_c(const dopt_options* o) {
    return reinterpret_cast<const Options*>(o);
  }

 private:
  std::map<std::string, Value> values_;
};

}  // namespace distopt
