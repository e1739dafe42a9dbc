// Component options: the C schema a plugin declares, and the validated values
// the host hands back through dopt_options.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <memory>
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
  /// ABI 1.2 flags: that bound is open. An infinite bound is open either way.
  bool min_exclusive = false, max_exclusive = false;

  /// INT / DOUBLE with min <= max.
  bool has_range() const {
    return (type == DOPT_OPTION_INT || type == DOPT_OPTION_DOUBLE) && min_value <= max_value;
  }
  /// v within the range (always true without one).
  bool in_range(double v) const;
  /// The range in interval notation, "(0, 1]", "[1, inf)"; "" without one.
  std::string range_text() const;
};

/// "bool", "int", "double" or "string" (as shown to users); "unknown" for
/// a value outside the enum. Static lifetime, thread-safe.
const char* option_type_name(dopt_option_type type);

/// A number as option ranges print it: integers in full ("1073741824"),
/// others in the shortest text that reads back exactly ("0.1"), "inf".
std::string format_option_number(double v);

/// Copy n C specs, reading only the fields each one's struct_size covers
/// (`flags` from ABI 1.2 on). `stride` is the byte distance between two
/// specs, the plugin's sizeof(dopt_option_spec) (the registry derives it
/// from the plugin's ABI minor); 0 = this host's sizeof, or the first spec's
/// struct_size rounded up to the alignment when that is larger.
std::vector<OptionSpec> specs_from_c(const dopt_option_spec* specs, size_t n, size_t stride = 0);

struct InnerComponent;  // registry.hpp

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
  /// A copy with option `name` set to `value` (autotuning). The caller keeps
  /// it valid for the schema: same type, within range.
  Options with(const std::string& name, Value value) const {
    Options o = *this;
    o.values_[name] = std::move(value);
    return o;
  }

  const dopt_options* c_handle() const { return reinterpret_cast<const dopt_options*>(this); }
  static const Options* from_c(const dopt_options* o) {
    return reinterpret_cast<const Options*>(o);
  }

  /// ABI 1.3: the reducer of the section's `inner:` key, resolved and
  /// validated (dopt_host_api::inner_reducer / create_inner_reducer find it
  /// through c_handle()); nullptr when there is none.
  const InnerComponent* inner() const { return inner_.get(); }
  void set_inner(std::shared_ptr<const InnerComponent> inner) { inner_ = std::move(inner); }

 private:
  std::map<std::string, Value> values_;
  std::shared_ptr<const InnerComponent> inner_;
};

}  // namespace distopt
