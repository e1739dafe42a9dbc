// The host's services below the ABI host table: the logger (spdlog, on
// stderr), job metrics, the thread-local error sink, status checking.
#include "base/services.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "distopt/error.hpp"

namespace distopt {
namespace {

// The error sink is per thread: a plugin sets it right before returning a
// negative status on the same thread, and the host reads it right after.
thread_local std::string t_last_error;

std::mutex g_metrics_mu;
std::map<std::string, double>& metrics() {
  static std::map<std::string, double> m;
  return m;
}

int level_from_env() {
  const char* v = std::getenv("DISTOPT_LOG_LEVEL");
  if (!v) return DOPT_LOG_INFO;
  std::string s(v);
  if (s == "debug" || s == "trace") return DOPT_LOG_DEBUG;
  if (s == "warn" || s == "warning") return DOPT_LOG_WARN;
  if (s == "error") return DOPT_LOG_ERROR;
  return DOPT_LOG_INFO;
}

spdlog::level::level_enum to_spdlog(int level) {
  switch (level) {
    case DOPT_LOG_DEBUG:
      return spdlog::level::debug;
    case DOPT_LOG_INFO:
      return spdlog::level::info;
    case DOPT_LOG_WARN:
      return spdlog::level::warn;
    default:
      return spdlog::level::err;
  }
}

// Logs go to stderr so they never mix with a command's output (tables, JSON).
spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::stderr_color_mt("distopt");
    lg->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    return lg;
  }();
  return *l;
}

std::atomic<int>& log_level() {
  static std::atomic<int> level{[] {
    int l = level_from_env();
    logger().set_level(to_spdlog(l));
    return l;
  }()};
  return level;
}

}  // namespace

void set_last_error(std::string msg) { t_last_error = std::move(msg); }

std::string take_last_error() {
  std::string s;
  s.swap(t_last_error);
  return s;
}

void check_status(dopt_status status, const std::string& component, const std::string& operation) {
  if (status >= 0) return;
  std::string detail = take_last_error();
  if (status == DOPT_ERR_COMM || status == DOPT_ERR_TIMEOUT || status == DOPT_ERR_ABORTED)
    throw CommError(status, component, operation, detail);
  throw ComponentError(status, component, operation, detail);
}

void metric_add(const std::string& name, double value) {
  std::lock_guard<std::mutex> lk(g_metrics_mu);
  metrics()[name] += value;
}

std::map<std::string, double> metrics_snapshot() {
  std::lock_guard<std::mutex> lk(g_metrics_mu);
  return metrics();
}

void metrics_reset() {
  std::lock_guard<std::mutex> lk(g_metrics_mu);
  metrics().clear();
}

void set_log_level(int level) {
  log_level().store(level);
  logger().set_level(to_spdlog(level));
}

void log(int level, const std::string& who, const std::string& msg) {
  if (level < log_level().load(std::memory_order_relaxed)) return;
  logger().log(to_spdlog(level), "[{}] {}", who, msg);
}

}  // namespace distopt
