// The host's services that plugins reach through the ABI host table and
// embedding programs call directly: the thread-local error sink, status
// checking, job metrics and the logger. distopt/host_api.hpp adds the table.
#pragma once

#include <map>
#include <string>

#include "distopt/abi.h"

namespace distopt {

/// Return and clear the calling thread's last error set by a plugin through
/// dopt_host_api::set_error ("" if none).
std::string take_last_error();

/// Throw if status < 0: CommError for DOPT_ERR_COMM / DOPT_ERR_TIMEOUT /
/// DOPT_ERR_ABORTED, ComponentError otherwise; the message names component,
/// operation and the error sink's detail.
void check_status(dopt_status status, const std::string& component, const std::string& operation);

/// Add `value` to the job metric `name` (summed counters written by plugins
/// through metric_add and by the core). Thread-safe.
void metric_add(const std::string& name, double value);
/// Every metric and its sum so far. Thread-safe.
std::map<std::string, double> metrics_snapshot();
/// Drop every metric. Thread-safe.
void metrics_reset();

/// Verbosity of the host logger (DOPT_LOG_*; default INFO, or
/// $DISTOPT_LOG_LEVEL = debug|info|warn|error). Thread-safe.
void set_log_level(int level);
/// One line on stderr, "[time] [level] [component] msg", if `level` is at
/// least the verbosity. Thread-safe.
void log(int level, const std::string& component, const std::string& msg);

}  // namespace distopt
