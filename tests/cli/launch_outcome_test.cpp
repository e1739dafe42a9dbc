// The launcher's judgement of its ranks' ends (tools/distopt/launch/
// outcome.hpp), driven without processes: which end stops the job, which
// rank is restarted, and the exit code, for plain and elastic jobs.
#include <doctest/doctest.h>

#include "launch/launcher.hpp"
#include "launch/outcome.hpp"

using distopt::launch::EndAction;
using distopt::launch::JobOutcome;
using distopt::launch::kExitInterrupted;
using distopt::launch::kExitOk;
using distopt::launch::kExitRankFailed;
using distopt::launch::kExitTimeout;

TEST_CASE("a plain job: every rank exits 0") {
  JobOutcome o(false, 0);
  o.begin_sweep();
  for (int r = 0; r < 4; ++r) CHECK(o.ended(r, true, false, false) == EndAction::kNone);
  CHECK(o.exit_code(false, false) == kExitOk);
  CHECK(o.deciding_failure() == -1);
}

TEST_CASE("a plain job: the first failure stops the others and decides the exit code") {
  JobOutcome o(false, 3);
  o.begin_sweep();
  CHECK(o.ended(0, true, false, false) == EndAction::kNone);
  CHECK(o.ended(2, false, false, false) == EndAction::kStopOthers);
  o.begin_sweep();
  // Before the launcher's SIGTERM: reported; after it: expected.
  CHECK(o.ended(1, false, false, false) == EndAction::kAlsoFailed);
  CHECK(o.ended(3, false, true, false) == EndAction::kNone);
  CHECK(o.exit_code(false, false) == kExitRankFailed);
  CHECK(o.deciding_failure() == 2);
  CHECK(o.restarts() == 0);  // max_restarts is for elastic jobs only
}

TEST_CASE("an interrupt or the timeout decides before any failure") {
  JobOutcome o(false, 0);
  o.begin_sweep();
  // Ctrl-C reached the rank before the launcher's SIGTERM: not a failure.
  CHECK(o.ended(0, false, false, true) == EndAction::kNone);
  CHECK(o.ended(1, false, true, true) == EndAction::kNone);
  CHECK(o.exit_code(true, false) == kExitInterrupted);
  JobOutcome t(false, 0);
  t.begin_sweep();
  CHECK(t.ended(0, false, true, false) == EndAction::kNone);
  CHECK(t.exit_code(false, true) == kExitTimeout);
  CHECK(t.exit_code(true, true) == kExitInterrupted);
}

TEST_CASE("elastic: failures are recorded, restarted while restarts are left") {
  JobOutcome o(true, 2);
  o.begin_sweep();
  CHECK(o.ended(1, false, false, false) == EndAction::kRestart);
  o.begin_sweep();
  CHECK(o.ended(1, false, false, false) == EndAction::kRestart);
  CHECK(o.restarts() == 2);
  o.begin_sweep();
  CHECK(o.ended(3, false, false, false) == EndAction::kRecordDead);
  CHECK(o.failures() == 3);
  // The survivors (and the restarted rank) finish: the job succeeded.
  o.begin_sweep();
  for (int r : {0, 1, 2}) CHECK(o.ended(r, true, false, false) == EndAction::kNone);
  CHECK(o.exit_code(false, false) == kExitOk);
}

TEST_CASE("elastic: a restart that could not start is not counted") {
  JobOutcome o(true, 1);
  o.begin_sweep();
  CHECK(o.ended(0, false, false, false) == EndAction::kRestart);
  o.restart_failed();
  CHECK(o.restarts() == 0);
  o.begin_sweep();
  CHECK(o.ended(1, false, false, false) == EndAction::kRestart);
  CHECK(o.restarts() == 1);
}

TEST_CASE("elastic: the ranks that ended last decide the exit code") {
  SUBCASE("a failure after the last exit 0 fails the job") {
    JobOutcome o(true, 0);
    o.begin_sweep();
    CHECK(o.ended(0, true, false, false) == EndAction::kNone);
    o.begin_sweep();
    CHECK(o.ended(1, false, false, false) == EndAction::kRecordDead);
    CHECK(o.exit_code(false, false) == kExitRankFailed);
    CHECK(o.deciding_failure() == 1);
    CHECK_FALSE(o.none_exited_ok());
  }
  SUBCASE("a failure and an exit 0 in the same pass: the failure is at the last exit 0") {
    JobOutcome o(true, 0);
    o.begin_sweep();
    CHECK(o.ended(0, false, false, false) == EndAction::kRecordDead);
    CHECK(o.ended(1, true, false, false) == EndAction::kNone);
    CHECK(o.exit_code(false, false) == kExitRankFailed);
  }
  SUBCASE("every rank failed") {
    JobOutcome o(true, 0);
    o.begin_sweep();
    for (int r = 0; r < 3; ++r) CHECK(o.ended(r, false, false, false) == EndAction::kRecordDead);
    CHECK(o.exit_code(false, false) == kExitRankFailed);
    CHECK(o.none_exited_ok());
    CHECK(o.deciding_failure() == 2);
  }
  SUBCASE("ends while the launcher stops the job are not failures of their own") {
    JobOutcome o(true, 5);
    o.begin_sweep();
    CHECK(o.ended(0, false, true, true) == EndAction::kNone);
    CHECK(o.restarts() == 0);
    CHECK(o.exit_code(true, false) == kExitInterrupted);
  }
}
