// A component's options, both ends: declaring the schema (the option
// builder: sdk::option_int / option_double / option_bool / option_string)
// and reading the validated values (OptionsView, through the host's option_*
// getters). Torch-free, header-only.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "distopt/abi.h"
#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk {

/// One option of a schema, built by the option_* functions below and
/// converted to the C dopt_option_spec (ABI 1.2 layout) where a table needs
/// it. Every member is constexpr, so a table is a constant:
///
///   constexpr dopt_option_spec kOptions[] = {
///       sdk::option_double("ratio", "0.01", "fraction of elements sent")
///           .range_open_min(0, 1),                          // (0, 1]
///       sdk::option_int("min_k", "256", "elements sent at least").at_least(1),   // [1, inf)
///       sdk::option_double("momentum", "0", "velocity decay").range_open_max(0, 1),  // [0, 1)
///       sdk::option_bool("error_feedback", "true", "keep what was not sent"),
///       sdk::option_string("partition", "greedy", "how to split").choices("greedy|contiguous"),
///       sdk::option_string("target", nullptr, "where to send it"),  // required: no default
///   };
///   DOPT_PLUGIN(..., DOPT_COMPONENT(MyReducer, "my", "1.0.0", "what it does", kOptions))
///
/// The default is YAML text ("0.01", "true", "greedy"), or nullptr for a
/// required option; the host checks at load time that every default passes
/// its own schema. Ranges apply to int and double options: a value outside
/// is an error naming the key's file:line:column and the range in interval
/// notation, e.g. "value 0 is out of range (0, 1]". `distopt plugins` prints
/// them so. Without a range call, any value of the type is accepted. An
/// infinite bound is always open. Hosts older than ABI 1.2 read only the
/// numbers and treat both bounds as inclusive.
class OptionDecl {
 public:
  constexpr OptionDecl(const char* name, dopt_option_type type, const char* default_value,
                       const char* help) noexcept
      : spec_{DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE,
              nullptr,
              name,
              type,
              default_value,
              0,
              -1,  // min > max: no range
              nullptr,
              help,
              0} {}

  /// [lo, hi]: both ends allowed.
  constexpr OptionDecl range(double lo, double hi) const noexcept { return with(lo, hi, 0); }
  /// (lo, hi]: lo itself refused (a ratio that must be positive).
  constexpr OptionDecl range_open_min(double lo, double hi) const noexcept {
    return with(lo, hi, DOPT_OPTION_MIN_EXCLUSIVE);
  }
  /// [lo, hi): hi itself refused (a decay factor below 1).
  constexpr OptionDecl range_open_max(double lo, double hi) const noexcept {
    return with(lo, hi, DOPT_OPTION_MAX_EXCLUSIVE);
  }
  /// (lo, hi): neither end allowed.
  constexpr OptionDecl range_open(double lo, double hi) const noexcept {
    return with(lo, hi, DOPT_OPTION_MIN_EXCLUSIVE | DOPT_OPTION_MAX_EXCLUSIVE);
  }
  /// [lo, inf)
  constexpr OptionDecl at_least(double lo) const noexcept { return with(lo, kInf, 0); }
  /// (lo, inf): e.g. greater_than(0) for "> 0".
  constexpr OptionDecl greater_than(double lo) const noexcept {
    return with(lo, kInf, DOPT_OPTION_MIN_EXCLUSIVE);
  }
  /// String options: the allowed values, '|'-separated ("greedy|contiguous").
  constexpr OptionDecl choices(const char* alternatives) const noexcept {
    OptionDecl d = *this;
    d.spec_.choices = alternatives;
    return d;
  }

  constexpr const dopt_option_spec& spec() const noexcept { return spec_; }
  constexpr operator dopt_option_spec() const noexcept { return spec_; }  // NOLINT: for tables

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr OptionDecl with(double lo, double hi, uint32_t flags) const noexcept {
    OptionDecl d = *this;
    d.spec_.min_value = lo;
    d.spec_.max_value = hi;
    d.spec_.flags = flags;
    return d;
  }
  dopt_option_spec spec_;
};

/// An int64 option. `default_value` is YAML text ("256") or nullptr (required).
constexpr OptionDecl option_int(const char* name, const char* default_value,
                                const char* help) noexcept {
  return OptionDecl(name, DOPT_OPTION_INT, default_value, help);
}
/// A float64 option (an integer in YAML is accepted too).
constexpr OptionDecl option_double(const char* name, const char* default_value,
                                   const char* help) noexcept {
  return OptionDecl(name, DOPT_OPTION_DOUBLE, default_value, help);
}
/// A bool option ("true" / "false").
constexpr OptionDecl option_bool(const char* name, const char* default_value,
                                 const char* help) noexcept {
  return OptionDecl(name, DOPT_OPTION_BOOL, default_value, help);
}
/// A string option; restrict it with .choices("a|b").
constexpr OptionDecl option_string(const char* name, const char* default_value,
                                   const char* help) noexcept {
  return OptionDecl(name, DOPT_OPTION_STRING, default_value, help);
}

/// A read-only view of validated options. Cheap to copy; valid as long as the
/// dopt_options it wraps (the host keeps it alive until the component is
/// destroyed). Thread-safe. Every getter throws sdk::Error(INVALID_ARGUMENT)
/// naming the option when it is not in the component's schema or has another
/// type (so a plugin bug surfaces as a clear error, not a garbage value).
class OptionsView {
 public:
  /// `h` defaults to the plugin's host (sdk::host()); pass one explicitly when
  /// the view is used outside a plugin (e.g. the host's own tests).
  explicit OptionsView(const dopt_options* opts, const dopt_host_api* h = host())
      : opts_(opts), host_(h) {}

  bool get_bool(const char* name) const {
    int32_t v = 0;
    check_get(host_ ? host_->option_bool(opts_, name, &v) : DOPT_ERR_STATE, name, "bool");
    return v != 0;
  }
  int64_t get_int(const char* name) const {
    int64_t v = 0;
    check_get(host_ ? host_->option_int(opts_, name, &v) : DOPT_ERR_STATE, name, "int");
    return v;
  }
  double get_double(const char* name) const {
    double v = 0;
    check_get(host_ ? host_->option_double(opts_, name, &v) : DOPT_ERR_STATE, name, "double");
    return v;
  }
  /// The string lives as long as the options object.
  std::string get_string(const char* name) const {
    const char* v = nullptr;
    check_get(host_ ? host_->option_string(opts_, name, &v) : DOPT_ERR_STATE, name, "string");
    return v ? std::string(v) : std::string();
  }

  const dopt_options* handle() const noexcept { return opts_; }

 private:
  static void check_get(dopt_status s, const char* name, const char* type) {
    if (s < 0)
      throw Error(DOPT_ERR_INVALID_ARGUMENT, std::string("option '") + name + "' (" + type +
                                                 ") is not available: " + dopt_status_string(s));
  }
  const dopt_options* opts_;
  const dopt_host_api* host_;
};

}  // namespace distopt::sdk
