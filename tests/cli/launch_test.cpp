// `distopt launch`: the real CLI on real processes.
#include <doctest/doctest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli_util.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using namespace distopt::test::cli;

namespace {

// Pids printed by ranks as "ready <pid>".
std::vector<pid_t> ready_pids(const std::string& out) {
  std::vector<pid_t> pids;
  std::regex re(R"(\[rank \d+\] ready (\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  return pids;
}

}  // namespace

TEST_CASE("launch prefixes every output line with the rank and sets the rank environment") {
  ProcResult r =
      run_command({cli(), "launch", "-n", "3", "--", "sh", "-c",
                   "echo \"out r=$DISTOPT_RANK w=$DISTOPT_WORLD_SIZE lr=$DISTOPT_LOCAL_RANK "
                   "lw=$DISTOPT_LOCAL_WORLD_SIZE rv=$DISTOPT_RENDEZVOUS tok=$DISTOPT_JOB_TOKEN "
                   "cfg=${DISTOPT_CONFIG:-none}\"; echo \"err $DISTOPT_RANK\" >&2; printf tail"});
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 0);
  std::regex out_re(
      R"(\[rank (\d)\] out r=(\d) w=3 lr=(\d) lw=3 rv=tcp://127\.0\.0\.1:(\d+) tok=([0-9a-f]{32}) cfg=none)");
  std::set<std::string> tokens, ports;
  std::set<int> ranks_seen;
  int err_lines = 0, tail_lines = 0;
  for (const auto& l : lines_of(r.output)) {
    CHECK_MESSAGE(l.rfind("[rank ", 0) == 0, "line without rank prefix: '" << l << "'");
    std::smatch m;
    if (std::regex_match(l, m, out_re)) {
      CHECK(m[1] == m[2]);  // the prefix names the rank that wrote the line
      CHECK(m[2] == m[3]);
      ranks_seen.insert(std::stoi(m[1]));
      ports.insert(m[4]);
      tokens.insert(m[5]);
    } else if (std::regex_match(l, m, std::regex(R"(\[rank (\d)\] err (\d))"))) {
      CHECK(m[1] == m[2]);
      ++err_lines;
    } else if (std::regex_match(l, std::regex(R"(\[rank \d\] tail)"))) {
      ++tail_lines;  // a last line without '\n' is still relayed, prefixed
    }
  }
  CHECK(ranks_seen == std::set<int>{0, 1, 2});
  CHECK(err_lines == 3);
  CHECK(tail_lines == 3);
  CHECK(tokens.size() == 1);  // one job, one token, one rendezvous
  CHECK(ports.size() == 1);

  // Another job gets another token.
  ProcResult r2 =
      run_command({cli(), "launch", "-n", "1", "--", "sh", "-c", "echo tok=$DISTOPT_JOB_TOKEN"});
  REQUIRE(r2.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r2.output, m, std::regex("tok=([0-9a-f]{32})")));
  CHECK(tokens.count(m[1]) == 0);
}

TEST_CASE("a rank renumbered by an elastic membership change gets its new number as prefix") {
  // What Runtime prints after a recovery renumbered it (runtime.cpp), on
  // stdout and stderr: the launcher drops the line and prefixes by it.
  ProcResult r =
      run_command({cli(), "launch", "-n", "2", "--", "sh", "-c",
                   "echo before; [ \"$DISTOPT_LAUNCHER_PREFIX\" = 1 ] || exit 5; "
                   "if [ $DISTOPT_RANK = 1 ]; then printf '\\033]distopt-rank=7\\007\\n'; "
                   "printf '\\033]distopt-rank=7\\007\\n' >&2; fi; echo after; echo err >&2"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("[rank 1] before") != std::string::npos);
  CHECK(r.output.find("[rank 7] after") != std::string::npos);
  CHECK(r.output.find("[rank 7] err") != std::string::npos);
  CHECK(r.output.find("[rank 0] after") != std::string::npos);
  CHECK(r.output.find("[rank 1] after") == std::string::npos);
  CHECK(r.output.find("distopt-rank") == std::string::npos);
}

TEST_CASE("launch splits the cores between the ranks unless OMP_NUM_THREADS is set") {
  ProcResult given =
      run_command({cli(), "launch", "-n", "2", "--", "sh", "-c", "echo omp=$OMP_NUM_THREADS"},
                  {"OMP_NUM_THREADS=3"});
  CHECK(given.exit_code == 0);
  CHECK(given.output.find("[rank 1] omp=3") != std::string::npos);
  if (std::getenv("OMP_NUM_THREADS")) return;  // cannot unset it for run_command
  ProcResult dflt =
      run_command({cli(), "launch", "-n", "2", "--", "sh", "-c", "echo omp=$OMP_NUM_THREADS"});
  INFO(dflt.output);
  // The cores this process may use (what `nproc` prints), not the machine's.
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  long cores = std::max(1L, static_cast<long>(CPU_COUNT(&set)));
  CHECK(dflt.output.find("[rank 0] omp=" + std::to_string(std::max(1L, cores / 2)) + "\n") !=
        std::string::npos);
}

TEST_CASE("launch --config and --port reach the ranks") {
  int port = distopt::test::random_port();
  ProcResult r = run_command({cli(), "launch", "-n", "2", "--config", "/some/job.yaml", "--port",
                              std::to_string(port), "--", "sh", "-c",
                              "echo $DISTOPT_CONFIG $DISTOPT_RENDEZVOUS"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  std::string want = "/some/job.yaml tcp://127.0.0.1:" + std::to_string(port);
  CHECK(r.output.find("[rank 0] " + want) != std::string::npos);
  CHECK(r.output.find("[rank 1] " + want) != std::string::npos);
}

TEST_CASE("launch --config without -n starts world.size ranks") {
  TempDir t;
  std::string cfg = t.file("job.yaml");
  std::ofstream(cfg) << "world: {size: 3}\n";
  ProcResult r = run_command(
      {cli(), "launch", "--config", cfg, "--", "sh", "-c", "echo ws=$DISTOPT_WORLD_SIZE"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  for (int k = 0; k < 3; ++k)
    CHECK(r.output.find("[rank " + std::to_string(k) + "] ws=3") != std::string::npos);
  std::ofstream(cfg) << "world: {size: many}\n";
  ProcResult bad = run_command({cli(), "launch", "--config", cfg, "--", "true"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.output.find(cfg) != std::string::npos);  // the config error names the file
}

TEST_CASE(
    "a rank exiting non-zero stops its sleeping siblings and fails the job, naming the rank") {
  // Rank 1 fails at once; ranks 0 and 2 would sleep 60 s. The 30 s limit is a
  // hang guard: if the siblings were not stopped the command would take 60 s.
  ProcResult r =
      run_command({cli(), "launch", "-n", "3", "--", "sh", "-c",
                   "if [ $DISTOPT_RANK = 1 ]; then sleep 0.3; echo dying >&2; exit 3; fi; "
                   "echo ready $$; exec sleep 60"},
                  {}, std::chrono::seconds(30));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("rank 1 failed (exit code 3)") != std::string::npos);
  CHECK(r.output.find("[rank 1] dying") != std::string::npos);
  auto pids = ready_pids(r.output);
  CHECK(pids.size() == 2);
  for (pid_t p : pids) CHECK_MESSAGE(!process_exists(p), "sibling " << p << " survived");
}

TEST_CASE("a rank killed by a signal fails the job, naming the rank and the signal") {
  ProcResult r =
      run_command({cli(), "launch", "-n", "2", "--", "sh", "-c",
                   "if [ $DISTOPT_RANK = 0 ]; then sleep 0.3; kill -9 $$; fi; exec sleep 60"},
                  {}, std::chrono::seconds(30));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("rank 0 failed (killed by signal 9") != std::string::npos);
}

TEST_CASE("a program that cannot be executed fails the job") {
  ProcResult r = run_command({cli(), "launch", "-n", "2", "--", "/nonexistent/program"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("cannot execute /nonexistent/program") != std::string::npos);
  CHECK(r.output.find("failed (exit code 127)") != std::string::npos);
}

TEST_CASE("launch --timeout stops a job that runs too long") {
  ProcResult r = run_command({cli(), "launch", "-n", "2", "--timeout", "1", "--", "sleep", "60"},
                             {}, std::chrono::seconds(30));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.exit_code == 124);
  CHECK(r.output.find("timed out") != std::string::npos);
}

TEST_CASE("launch rejects bad usage") {
  ProcResult none = run_command({cli(), "launch", "-n", "2"});
  CHECK(none.exit_code == 2);
  CHECK(none.output.find("no program") != std::string::npos);
  ProcResult zero = run_command({cli(), "launch", "-n", "0", "--", "true"});
  CHECK(zero.exit_code == 2);
  ProcResult no_n = run_command({cli(), "launch", "--", "true"});
  CHECK(no_n.exit_code == 2);
  ProcResult bad = run_command({cli(), "launch", "-n", "two", "--", "true"});
  CHECK(bad.exit_code == 2);
}

TEST_CASE("SIGINT to launch stops every rank and leaves no process behind") {
  SUBCASE("ranks that exit on SIGINT") {
    Background b({cli(), "launch", "-n", "2", "--", "sh", "-c", "echo ready $$; exec sleep 60"});
    REQUIRE(b.read_until([](const std::string& o) { return ready_pids(o).size() == 2; },
                         std::chrono::seconds(30)));
    auto pids = ready_pids(b.output);
    REQUIRE(kill(b.pid, SIGINT) == 0);
    int rc = b.wait(std::chrono::seconds(30));
    INFO(b.output);
    CHECK(rc == 130);
    CHECK(b.output.find("interrupted") != std::string::npos);
    for (pid_t p : pids) CHECK_MESSAGE(!process_exists(p), "rank process " << p << " survived");
  }
  SUBCASE("ranks that ignore SIGINT and SIGTERM are killed after the grace period") {
    Background b({cli(), "launch", "-n", "2", "--grace", "1", "--", "sh", "-c",
                  "trap '' INT TERM; sleep 60 & echo ready $!; wait"});
    REQUIRE(b.read_until([](const std::string& o) { return ready_pids(o).size() == 2; },
                         std::chrono::seconds(30)));
    auto pids = ready_pids(b.output);  // the sleeps: grandchildren of the launcher
    REQUIRE(kill(b.pid, SIGINT) == 0);
    int rc = b.wait(std::chrono::seconds(30));
    INFO(b.output);
    CHECK(rc == 130);
    CHECK(b.output.find("SIGKILL") != std::string::npos);
    // SIGKILL to a grandchild is delivered asynchronously: allow it up to 10 s
    // (a loaded machine), polling.
    for (int i = 0; i < 500; ++i) {
      bool any = false;
      for (pid_t p : pids) any = any || process_exists(p);
      if (!any) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (pid_t p : pids) CHECK_MESSAGE(!process_exists(p), "grandchild " << p << " survived");
  }
}

TEST_CASE("launch refuses -n that contradicts the job file's world.size, naming both") {
  TempDir t;  // cli_util.hpp: removed at scope exit
  const std::string job = t.file("job.yaml");
  std::ofstream(job) << "world:\n  size: 2\n";
  ProcResult r = run_command({cli(), "launch", "-n", "3", "--config", job, "--", "true"});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("-n 3") != std::string::npos);
  CHECK(r.output.find(job + ":2: world.size is 2") != std::string::npos);
  // The same number, or no -n, is fine.
  CHECK(run_command({cli(), "launch", "-n", "2", "--config", job, "--", "true"}).exit_code == 0);
  CHECK(run_command({cli(), "launch", "--config", job, "--", "true"}).exit_code == 0);
}

TEST_CASE(
    "plugins: the build tree's plugins are found without DISTOPT_PLUGIN_PATH; -P comes first") {
  ProcResult r = run_command({"env", "-u", "DISTOPT_PLUGIN_PATH", cli(), "plugins"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("libdistopt_tcp.so") != std::string::npos);
  // A second file providing the same component: -P's copy wins, in every
  // command (one search order).
  const char* plugins = std::getenv("DISTOPT_PLUGIN_DIR");
  REQUIRE(plugins);
  TempDir t;
  const std::string copy = t.file("libdistopt_mean.so");
  distopt::test::copy_file(std::string(plugins) + "/libdistopt_mean.so", copy);
  ProcResult p = run_command({"env", "-u", "DISTOPT_PLUGIN_PATH", cli(), "plugins", "-P", t.path});
  INFO(p.output);
  const size_t row = p.output.find("reducer       mean");
  REQUIRE(row != std::string::npos);
  CHECK(p.output.substr(row, p.output.find('\n', row) - row).find(copy) != std::string::npos);
}
