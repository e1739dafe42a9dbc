// The launcher's judgement of its ranks' ends, without processes: which end
// stops the job, which rank is restarted, and the exit code (launcher.hpp's
// kExit* rule). The Supervisor (launcher.cpp) feeds it what waitpid reports;
// tests feed it sequences of ends (tests/cli/launch_outcome_test.cpp).
#pragma once

#include <string>

namespace distopt::launch {

/// What the Supervisor does about one rank process that ended.
enum class EndAction {
  kNone,        ///< nothing (an exit 0, or an end while the job is stopping)
  kStopOthers,  ///< the job's first failure: stop the other ranks after failure_wait_s
  kAlsoFailed,  ///< a later failure of a job already stopping: report it
  kRecordDead,  ///< elastic: record the failure in the store; the others go on
  kRestart,     ///< elastic: record it, and start the rank again (a restart is left)
};

/// Not thread-safe: one Supervisor's loop calls it.
class JobOutcome {
 public:
  /// `elastic`: LaunchOptions::elastic; `max_restarts`: restarts allowed on
  /// this node in all (elastic only).
  JobOutcome(bool elastic, int max_restarts);

  /// One pass of the poll loop found ended ranks: the ends reported until the
  /// next call count as ending together.
  void begin_sweep();

  /// Local rank `rank` ended; `ok`: exit code 0. `terminating`: the launcher
  /// has sent its ranks SIGTERM (after a failure's wait, the timeout or an
  /// interrupt), so ends are expected; `interrupted`: the launcher got a
  /// signal. kRestart counts a restart; report one that could not start with
  /// restart_failed().
  EndAction ended(int rank, bool ok, bool terminating, bool interrupted);

  /// A kRestart that could not start (no member id from the store): the
  /// restart is not counted.
  void restart_failed();

  /// The exit code (kExitInterrupted, kExitTimeout, kExitRankFailed, kExitOk).
  int exit_code(bool interrupted, bool timed_out) const;

  /// The failed rank that decides a failing exit code (-1: none): the first
  /// failure, or elastic, the last.
  int deciding_failure() const { return elastic_ ? last_failed_rank_ : failed_rank_; }
  int failures() const { return failures_; }
  int restarts() const { return restarts_; }
  /// Elastic: true when no rank exited 0 (else a failure came after the last one).
  bool none_exited_ok() const { return last_ok_sweep_ < 0; }

 private:
  bool elastic_;
  int max_restarts_;
  int failed_rank_ = -1;  // not elastic: the first failure
  // Elastic: passes that found ended ranks are numbered; the last pass with
  // an exit 0 and the last with a failure decide the exit code.
  int sweep_ = 0, last_ok_sweep_ = -1, last_failure_sweep_ = -1;
  int failures_ = 0, last_failed_rank_ = -1, restarts_ = 0;
};

}  // namespace distopt::launch
