// The launcher's judgement of its ranks' ends (outcome.hpp).
#include "launch/outcome.hpp"

#include "launch/launcher.hpp"

namespace distopt::launch {

JobOutcome::JobOutcome(bool elastic, int max_restarts)
    : elastic_(elastic), max_restarts_(max_restarts) {}

void JobOutcome::begin_sweep() { ++sweep_; }

EndAction JobOutcome::ended(int rank, bool ok, bool terminating, bool interrupted) {
  if (elastic_ && !terminating && !interrupted) {
    if (ok) {
      last_ok_sweep_ = sweep_;
      return EndAction::kNone;
    }
    last_failure_sweep_ = sweep_;
    last_failed_rank_ = rank;
    ++failures_;
    if (restarts_ >= max_restarts_) return EndAction::kRecordDead;
    ++restarts_;
    return EndAction::kRestart;
  }
  if (ok || terminating) return EndAction::kNone;
  if (failed_rank_ >= 0) {
    ++failures_;
    return EndAction::kAlsoFailed;
  }
  if (interrupted) return EndAction::kNone;  // Ctrl-C reached it first
  failed_rank_ = rank;
  ++failures_;
  return EndAction::kStopOthers;
}

void JobOutcome::restart_failed() {
  if (restarts_ > 0) --restarts_;
}

int JobOutcome::exit_code(bool interrupted, bool timed_out) const {
  if (interrupted) return kExitInterrupted;
  if (timed_out) return kExitTimeout;
  if (elastic_) return last_ok_sweep_ > last_failure_sweep_ ? kExitOk : kExitRankFailed;
  return failed_rank_ >= 0 ? kExitRankFailed : kExitOk;
}

}  // namespace distopt::launch
