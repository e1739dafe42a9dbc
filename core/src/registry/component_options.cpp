// distopt::Options: validation of a component's YAML options against the C
// schema it declares, and the typed getters behind dopt_host_api::option_*.
#include "distopt/component_options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "base/yaml_util.hpp"
#include "distopt/error.hpp"

namespace distopt {

const char* option_type_name(dopt_option_type t) {
  switch (t) {
    case DOPT_OPTION_BOOL:
      return "bool";
    case DOPT_OPTION_INT:
      return "int";
    case DOPT_OPTION_DOUBLE:
      return "double";
    case DOPT_OPTION_STRING:
      return "string";
  }
  return "unknown";
}

namespace {

using namespace yaml;

const char* value_type_name(const Options::Value& v) {
  switch (v.index()) {
    case 0:
      return "bool";
    case 1:
      return "int";
    case 2:
      return "double";
    default:
      return "string";
  }
}

}  // namespace

std::string format_option_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // integers as integers: "10", not "1e+01"
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Prefer the shortest text that round-trips ("0.1", not "0.10000000000000001").
  for (int prec = 1; prec <= 17; ++prec) {
    char s[64];
    std::snprintf(s, sizeof s, "%.*g", prec, v);
    if (std::strtod(s, nullptr) == v) return s;
  }
  return buf;
}

bool OptionSpec::in_range(double v) const {
  if (!has_range()) return true;
  // An infinite bound is open: inf itself is never a valid value.
  const bool lo_open = min_exclusive || std::isinf(min_value);
  const bool hi_open = max_exclusive || std::isinf(max_value);
  return (lo_open ? v > min_value : v >= min_value) && (hi_open ? v < max_value : v <= max_value);
}

std::string OptionSpec::range_text() const {
  if (!has_range()) return "";
  const bool lo_open = min_exclusive || std::isinf(min_value);
  const bool hi_open = max_exclusive || std::isinf(max_value);
  return std::string(lo_open ? "(" : "[") + format_option_number(min_value) + ", " +
         format_option_number(max_value) + (hi_open ? ")" : "]");
}

namespace {

std::vector<std::string> split_choices(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == '|' || *p == '\0') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return out;
}

// Convert `node` to the spec's type and check range / choices. `key` is the
// dotted path used in messages ("reducer.options.level").
Options::Value convert_value(const YAML::Node& node, const OptionSpec& spec,
                             const std::string& file, const YAML::Mark& mark,
                             const std::string& key) {
  auto wrong = [&](const char* expected) {
    fail(file, mark, key + ": expected " + expected + ", got " + describe(node));
  };
  auto check_range = [&](double v) {
    if (!spec.in_range(v))
      fail(file, mark, key + ": value " + node.Scalar() + " is out of range " + spec.range_text());
  };
  switch (spec.type) {
    case DOPT_OPTION_BOOL: {
      auto v = to_bool(node);
      if (!v) wrong("a bool (true/false)");
      return *v;
    }
    case DOPT_OPTION_INT: {
      auto v = to_int(node);
      if (!v) wrong("an integer");
      check_range(static_cast<double>(*v));
      return *v;
    }
    case DOPT_OPTION_DOUBLE: {
      auto v = to_double(node);
      if (!v) wrong("a number");
      check_range(*v);
      return *v;
    }
    case DOPT_OPTION_STRING: {
      auto v = to_string(node);
      if (!v) wrong("a string");
      if (!spec.choices.empty()) {
        bool ok = false;
        for (const auto& c : spec.choices) ok = ok || c == *v;
        if (!ok) fail(file, mark, key + ": '" + *v + "' is not one of " + join(spec.choices, "|"));
      }
      return *v;
    }
  }
  fail(file, mark, key + ": option has an invalid type in its schema");
}

}  // namespace

std::vector<OptionSpec> specs_from_c(const dopt_option_spec* specs, size_t n, size_t stride) {
  std::vector<OptionSpec> out;
  if (!specs || n == 0) return out;
  // An array of extensible structs: its stride is the plugin's sizeof. Not
  // told, assume this host's headers (a newer minor's larger struct_size wins).
  if (stride == 0) {
    const size_t a = alignof(dopt_option_spec);
    stride = std::max(sizeof(dopt_option_spec), (specs[0].struct_size + a - 1) / a * a);
  }
  const char* base = reinterpret_cast<const char*>(specs);
  for (size_t i = 0; i < n; ++i) {
    const auto* s = reinterpret_cast<const dopt_option_spec*>(base + i * stride);
    OptionSpec o;
    if (DOPT_HAS_FIELD(s, dopt_option_spec, name) && s->name) o.name = s->name;
    if (DOPT_HAS_FIELD(s, dopt_option_spec, type)) o.type = static_cast<dopt_option_type>(s->type);
    if (DOPT_HAS_FIELD(s, dopt_option_spec, default_value) && s->default_value)
      o.default_value = std::string(s->default_value);
    if (DOPT_HAS_FIELD(s, dopt_option_spec, max_value)) {
      o.min_value = s->min_value;
      o.max_value = s->max_value;
    }
    if (DOPT_HAS_FIELD(s, dopt_option_spec, choices)) o.choices = split_choices(s->choices);
    if (DOPT_HAS_FIELD(s, dopt_option_spec, help) && s->help) o.help = s->help;
    if (DOPT_HAS_FIELD(s, dopt_option_spec, flags)) {  // ABI 1.2; older bounds are inclusive
      o.min_exclusive = (s->flags & DOPT_OPTION_MIN_EXCLUSIVE) != 0;
      o.max_exclusive = (s->flags & DOPT_OPTION_MAX_EXCLUSIVE) != 0;
    }
    out.push_back(std::move(o));
  }
  return out;
}

Options Options::validate(const YAML::Node& node, const std::vector<OptionSpec>& schema,
                          const std::string& file, const std::string& where) {
  Options opts;
  const YAML::Mark section_mark = mark_of(node);
  const bool absent = !node.IsDefined() || node.IsNull();
  if (!absent && !node.IsMap())
    fail(file, section_mark, where + ": expected a map of options, got " + describe(node));

  std::vector<std::string> valid;
  for (const auto& s : schema) valid.push_back(s.name);

  if (!absent) {
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const YAML::Node k = kv.first;  // copies: the iterator's pair is a temporary
      const YAML::Node v = kv.second;
      const YAML::Mark kmark = mark_of(k, section_mark);
      if (!k.IsScalar())
        fail(file, kmark, where + ": option names must be strings, got " + describe(k));
      const std::string key = k.Scalar();
      if (!seen.insert(key).second) fail(file, kmark, where + ": duplicate key '" + key + "'");
      const OptionSpec* spec = nullptr;
      for (const auto& s : schema)
        if (s.name == key) spec = &s;
      if (!spec) fail(file, kmark, unknown_key_message(key, where, valid));
      opts.values_[key] = convert_value(v, *spec, file, mark_of(v, kmark), where + "." + key);
    }
  }

  // Defaults for what the YAML left out; a spec without one is required.
  for (const auto& s : schema) {
    if (opts.values_.count(s.name)) continue;
    if (!s.default_value)
      fail(file, section_mark,
           where + ": missing required option '" + s.name + "' (" + option_type_name(s.type) +
               (s.help.empty() ? "" : ": " + s.help) + ")");
    YAML::Node def(*s.default_value);  // a plain scalar, as the schema's YAML text
    try {
      opts.values_[s.name] =
          convert_value(def, s, file, section_mark, where + "." + s.name + " (default)");
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " [the component's schema declares a bad default]");
    }
  }
  return opts;
}

namespace {
template <typename T>
const T& get_typed(const std::map<std::string, Options::Value>& values, const std::string& name,
                   const char* wanted) {
  auto it = values.find(name);
  if (it == values.end()) throw ConfigError("option '" + name + "' is not set");
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  throw ConfigError("option '" + name + "' is a " + value_type_name(it->second) + ", not a " +
                    wanted);
}
}  // namespace

bool Options::get_bool(const std::string& name) const {
  return get_typed<bool>(values_, name, "bool");
}
int64_t Options::get_int(const std::string& name) const {
  return get_typed<int64_t>(values_, name, "int");
}
double Options::get_double(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end())
    if (const int64_t* v = std::get_if<int64_t>(&it->second)) return static_cast<double>(*v);
  return get_typed<double>(values_, name, "double");
}
const std::string& Options::get_string(const std::string& name) const {
  return get_typed<std::string>(values_, name, "string");
}

}  // namespace distopt
