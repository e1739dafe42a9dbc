// The host's watchdog over calls into components: a call that never
// returns (a plugin deadlocked in its own code, a communicator stuck past
// its own timeout) ends the rank with a message naming the rank, the
// component and the operation, so the launcher ends the job as it does for
// a dead peer. A thread stuck in a plugin cannot be unwound, so ending the
// process is the only way out; the message is what the user gets instead
// of a silent hang (as NCCL's and PyTorch's watchdogs do).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace distopt {

/// Exit status of a rank the watchdog ends.
inline constexpr int kWatchdogExitCode = 70;

/// Turn the watchdog on (`seconds` > 0) or off (0) for this process, as
/// rank `rank` of the job (named in its message). The first call with
/// seconds > 0 starts the watchdog's thread, which checks the open scopes
/// about once a second (finer for limits under 4 s). Runtime calls it with
/// world.watchdog_s (JobConfig::watchdog_seconds); a later call updates
/// the limit and the rank (an elastic job's new numbering). Thread-safe.
void set_watchdog(double seconds, int rank);

/// The limit in force, seconds (0: off). Thread-safe.
double watchdog_seconds();

/// One call into a component, watched while the object lives (RAII; open
/// it just around the call). `kind` ("algorithm", "communicator"), `name`
/// (the component's name) and `op` ("step", "allreduce") must outlive the
/// scope; `detail` (a bucket index, say) follows `op` when >= 0. Scopes nest
/// (an algorithm's step waiting on a communicator's allreduce): the message
/// names the whole nesting of the stuck thread, outermost first. Costs a
/// mutex lock and an atomic load when on, an atomic load when off.
/// Thread-safe; a scope belongs to the thread that opened it.
class WatchdogScope {
 public:
  WatchdogScope(const char* kind, const std::string& name, const char* op, int64_t detail = -1);
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

  struct Entry;

 private:
  Entry* entry_ = nullptr;  // null when the watchdog was off at the start
};

}  // namespace distopt
