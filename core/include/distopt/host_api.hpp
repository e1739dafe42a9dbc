// The host side of the plugin ABI: the dopt_host_api table, the thread-local
// error sink, metrics counters and status checking.
#pragma once

#include <map>
#include <string>

#include "distopt/abi.h"

namespace distopt {

/// The process-wide host API table passed to every plugin. Thread-safe.
const dopt_host_api* host_api();

/// Return and clear the calling thread's last error set by a plugin through
/// dopt_host_api::set_error ("" if none).
std::string take_last_error();

/// Throw if status < 0: CommError for DOPT_ERR_COMM / DOPT_ERR_TIMEOUT /
/// DOPT_ERR_ABORTED, ComponentError otherwise; the message names component,
/// operation and the error sink's detail.
void check_status(dopt_status status, const std::string& component, const std::string& operation);

/// Job metrics (summed counters written by plugins through metric_add and by
/// the core). Thread-safe.
void metric_add(const std::string& name, double value);
std::map<std::string, double> metrics_snapshot();
void metrics_reset();

/// Verbosity of the host logger (DOPT_LOG_*; default INFO, or
/// $DISTOPT_LOG_LEVEL = debug|info|warn|error).
void set_log_level(int level);
void log(int level, const std::string& who, const std::string& msg);

}  // namespace distopt
