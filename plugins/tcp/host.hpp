// The host services this plugin was initialised with, and small wrappers.
#pragma once

#include <string>

#include "distopt/abi.h"

namespace distopt::plugins::tcp {

/// Set once by dopt_plugin_init_v1; valid until the library is unloaded.
extern const dopt_host_api* g_host;

inline void log(int level, const std::string& msg) {
  if (g_host && g_host->log) g_host->log(level, "tcp", msg.c_str());
}
inline void set_error(const std::string& msg) {
  if (g_host && g_host->set_error) g_host->set_error(msg.c_str());
}
inline void metric(const char* name, double v) {
  if (g_host && g_host->metric_add) g_host->metric_add(name, v);
}

}  // namespace distopt::plugins::tcp
