// Private: the host's services below the ABI host table: the logger, job
// metrics, the thread-local error sink and status checking. Layers below
// registry/ (which builds the dopt_host_api table over these) include this,
// not distopt/host_api.hpp. The functions other than set_last_error are also
// declared there, for embedding programs; the two declarations must agree
// (a mismatch is a link error).
#pragma once

#include <map>
#include <string>

#include "distopt/abi.h"

namespace distopt {

/// Set the calling thread's error sink (dopt_host_api::set_error; a wrapper
/// communicator's own refusal). take_last_error reads and clears it.
void set_last_error(std::string msg);

/// Return and clear the calling thread's error sink ("" if none).
std::string take_last_error();

/// Throw if status < 0: CommError for DOPT_ERR_COMM / DOPT_ERR_TIMEOUT /
/// DOPT_ERR_ABORTED, ComponentError otherwise; the message names component,
/// operation and the error sink's detail.
void check_status(dopt_status status, const std::string& component, const std::string& operation);

/// Add `value` to the job metric `name` (summed counters). Thread-safe.
void metric_add(const std::string& name, double value);
/// Every metric and its sum so far. Thread-safe.
std::map<std::string, double> metrics_snapshot();
/// Drop every metric. Thread-safe.
void metrics_reset();

/// Verbosity of the logger (DOPT_LOG_*; default INFO, or
/// $DISTOPT_LOG_LEVEL = debug|info|warn|error). Thread-safe.
void set_log_level(int level);
/// One line on stderr, "[time] [level] [who] msg", if `level` is at least
/// the verbosity. Thread-safe.
void log(int level, const std::string& who, const std::string& msg);

}  // namespace distopt
