// `distopt launch --elastic` (the launcher side): the real CLI
// starting launch_elastic_rank, whose ranks use the store it serves.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli_util.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using namespace distopt::test::cli;

namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

ProcResult launch(const std::vector<std::string>& options, const std::vector<std::string>& program,
                  const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {cli(), "launch"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back("--");
  argv.insert(argv.end(), program.begin(), program.end());
  return run_command(argv, env, std::chrono::seconds(180));  // hang guard
}

}  // namespace

TEST_CASE("--elastic: a failed rank is recorded in the launcher's store and the others go on") {
  // Rank 0 exits before rank 2 uses the store: only a store the launcher
  // serves is still there.
  ProcResult r = launch({"-n", "3", "--elastic"}, {DISTOPT_ELASTIC_RANK, "survive"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.output, "rank 1 failed (exit code 3); elastic: the other ranks go on") == 1);
  CHECK(count_of(r.output, "[rank 0] rank 0: elastic/dead/1 = exit code 3") == 1);
  CHECK(count_of(r.output, "[rank 2] rank 2: elastic/dead/1 = exit code 3") == 1);
  CHECK(count_of(r.output, "[rank 2] rank 2 used the store after rank 0 exited (dead_count 1)") ==
        1);
  CHECK(r.output.find("CHECK FAILED") == std::string::npos);
}

TEST_CASE("without --elastic the same failure stops the other ranks and fails the job") {
  // Ranks 0 and 2 would wait 60 s for a record nobody writes: they are stopped.
  ProcResult r = launch({"-n", "3", "--failure-wait", "0"}, {DISTOPT_ELASTIC_RANK, "survive"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("rank 1 failed (exit code 3), stopping the other ranks") !=
        std::string::npos);
  CHECK(r.output.find("elastic") == std::string::npos);
}

TEST_CASE(
    "--elastic exports DISTOPT_STORE_SERVED and DISTOPT_ELASTIC; a plain launch removes them") {
  const std::vector<std::string> show = {
      "sh", "-c",
      "echo \"served=${DISTOPT_STORE_SERVED:-unset} elastic=${DISTOPT_ELASTIC:-unset} "
      "restart=${DISTOPT_RESTART_COUNT:-unset}\""};
  // As inherited from an enclosing elastic launch.
  const std::vector<std::string> inherited = {"DISTOPT_STORE_SERVED=1", "DISTOPT_ELASTIC=1",
                                              "DISTOPT_RESTART_COUNT=2"};
  ProcResult e = launch({"-n", "2", "--elastic"}, show, inherited);
  INFO(e.output);
  CHECK(e.exit_code == 0);
  CHECK(count_of(e.output, "] served=1 elastic=1 restart=unset") == 2);
  ProcResult p = launch({"-n", "2"}, show, inherited);
  INFO(p.output);
  CHECK(p.exit_code == 0);
  CHECK(count_of(p.output, "] served=unset elastic=unset restart=unset") == 2);
}

TEST_CASE("--elastic on two nodes: node 1's launcher records its dead rank in node 0's store") {
  const std::string port = std::to_string(distopt::test::random_port());
  auto node = [&](int r) {
    std::vector<std::string> argv = {cli(), "launch", "--elastic", "-n", "1", "--nnodes", "2"};
    argv.insert(argv.end(), {"--node-rank", std::to_string(r), "--master-port", port});
    argv.insert(argv.end(),
                {"--rdzv-id", "elastic-two-nodes", "--", DISTOPT_ELASTIC_RANK, "remote"});
    return argv;
  };
  // Node 0 first: its launcher serves the store before it says which ranks it runs.
  Background node0(node(0));
  REQUIRE(node0.read_until(
      [](const std::string& o) { return o.find("node 0 of 2") != std::string::npos; },
      std::chrono::seconds(60)));
  ProcResult node1 = run_command(node(1), {}, std::chrono::seconds(180));
  const int rc0 = node0.wait(std::chrono::seconds(180));
  INFO(node0.output);
  INFO(node1.output);
  CHECK(rc0 == 0);
  CHECK(node0.output.find("[rank 0] rank 0: elastic/dead/1 = exit code 3") != std::string::npos);
  // Node 1's launcher served nothing (else it could not bind the port) and
  // judges its own ranks only: its one rank failed.
  CHECK(node1.exit_code == 1);
  CHECK(node1.output.find("rank 1 failed (exit code 3); elastic: the other ranks go on") !=
        std::string::npos);
  CHECK(node1.output.find("cannot record") == std::string::npos);
}

TEST_CASE("--elastic: the job fails when every rank fails") {
  ProcResult r = launch({"-n", "3", "--elastic"}, {"sh", "-c", "exit 3"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(count_of(r.output, "failed (exit code 3); elastic: the other ranks go on") == 3);
  CHECK(r.output.find("no rank exited 0") != std::string::npos);
}

TEST_CASE("--elastic: the job fails when a rank fails after the last one that exited 0") {
  ProcResult r = launch({"-n", "2", "--elastic"}, {DISTOPT_ELASTIC_RANK, "fail_last"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("[rank 1] rank 1 fails after rank 0 exited 0") != std::string::npos);
  CHECK(r.output.find("rank 1 failed (exit code 3); elastic") != std::string::npos);
}

TEST_CASE("--elastic --max-restarts 1: a failed rank is recorded once and restarted") {
  ProcResult r =
      launch({"-n", "3", "--elastic", "--max-restarts", "1"}, {DISTOPT_ELASTIC_RANK, "restart"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.output, "rank 1 failed (exit code 3); elastic") == 1);
  CHECK(count_of(r.output, "restarting rank 1 (DISTOPT_RESTART_COUNT=1;") == 1);
  CHECK(count_of(r.output,
                 "[rank 1] rank 1 restarted: DISTOPT_RESTART_COUNT=1, elastic/dead/1 = "
                 "exit code 3, dead_count 1") == 1);
  CHECK(count_of(r.output, "saw rank 1 back (restart 1), dead_count 1") == 2);
}

TEST_CASE("--max-restarts bounds the restarts of this node's launcher") {
  // Rank 1 always fails: started, restarted once, recorded dead twice; ranks
  // 0 and 2 end after the second record, so the job ends and succeeds.
  ProcResult r = launch({"-n", "3", "--elastic", "--max-restarts", "1"},
                        {DISTOPT_ELASTIC_RANK, "keep_failing", "2"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(count_of(r.output, "rank 1 failed (exit code 3); elastic") == 2);
  CHECK(count_of(r.output, "restarting rank 1") == 1);
  CHECK(count_of(r.output, "saw dead_count 2") == 2);
}

TEST_CASE("a bad --max-restarts is a usage error naming the option") {
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"--elastic", "--max-restarts=-1"},
           {"--elastic", "--max-restarts", "two"},
           {"--max-restarts", "1"}}) {  // restarts without --elastic
    std::vector<std::string> options = {"-n", "2"};
    options.insert(options.end(), bad.begin(), bad.end());
    ProcResult r = launch(options, {"true"});
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("max-restarts") != std::string::npos);
  }
}
