// Typed access to a component's validated options (dopt_options) through the
// host's option_* getters. Torch-free, header-only.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/abi.h"
#include "distopt/sdk/host.hpp"

namespace distopt::sdk {

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
