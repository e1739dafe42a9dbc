// Checks of the tests that run the `distopt` executable ($DISTOPT_CLI) on a
// job file: `distopt check` refusing or accepting it, `distopt train` to its
// metrics summary, and a job whose rank 1 is killed mid-training. Include
// after doctest.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "multiproc.hpp"
#include "train_metrics.hpp"

namespace distopt::test {

/// `distopt check JOB` fails (exit code 1) and its output holds the file
/// followed by `where` (":LINE:" or ":LINE:COLUMN: key") and each of `why`.
inline void check_refuses(const std::string& job, const std::string& where,
                          const std::vector<std::string>& why) {
  const ProcResult r =
      run_command({env_path("DISTOPT_CLI"), "check", job}, {}, std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(job + where) != std::string::npos);
  for (const std::string& w : why) CHECK(r.output.find(w) != std::string::npos);
}

/// `distopt check JOB` passes (exit code 0).
inline void check_accepts(const std::string& job) {
  const ProcResult r =
      run_command({env_path("DISTOPT_CLI"), "check", job}, {}, std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

/// `distopt train JOB --metrics METRICS` (300 s limit) succeeds and reports
/// the replicas' consensus distance (decentralized and local SGD ranks
/// drift apart); returns the metrics' summary line (a JSON object).
inline nlohmann::json train_consensus_summary(const std::string& job, const std::string& metrics) {
  const ProcResult r = run_command({env_path("DISTOPT_CLI"), "train", job, "--metrics", metrics},
                                   {}, std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("consensus distance") != std::string::npos);
  nlohmann::json summary = metrics_summary(metrics);
  REQUIRE(summary.is_object());
  return summary;
}

/// `distopt train JOB` (2 ranks, self-launched; 120 s limit) with rank 1
/// killed before step 5 (DISTOPT_FAULT_INJECT): the launcher names rank 1
/// and exits 1, and rank 0 reports an error naming rank 1.
inline void check_killed_rank_named(const std::string& job) {
  const ProcResult r = run_command({env_path("DISTOPT_CLI"), "train", job},
                                   {"DISTOPT_FAULT_INJECT=exit:1:5"}, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("rank 1 failed (exit code 137)") != std::string::npos);
  CHECK(std::regex_search(r.output, std::regex(R"(\[rank 0\] .*error.*rank 1)")));
}

}  // namespace distopt::test
