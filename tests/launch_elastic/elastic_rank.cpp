// A rank of launch_elastic_test: meets the others through the rendezvous
// store `distopt launch` names in its environment (DISTOPT_RENDEZVOUS,
// DISTOPT_JOB_TOKEN; make_store reads DISTOPT_STORE_SERVED) and plays one
// scenario, argv[1]. Prints what it saw; exit 0 = as expected, 3 = the
// planned failure, others = a check failed (the line before says which).
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "distopt/store.hpp"

using namespace std::chrono_literals;

namespace {

constexpr auto kWait = std::chrono::milliseconds(60000);  // hang guard of every wait

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::shared_ptr<distopt::Store> connect() {
  distopt::StoreOptions so;
  const char* url = std::getenv("DISTOPT_RENDEZVOUS");
  const char* token = std::getenv("DISTOPT_JOB_TOKEN");
  so.url = url ? url : "";
  so.token = token ? token : "";
  so.rank = env_int("DISTOPT_RANK", 0);
  so.world_size = env_int("DISTOPT_WORLD_SIZE", 1);
  so.timeout = 30s;
  return distopt::make_store(so);
}

std::string get(distopt::Store& s, const std::string& key) {
  auto v = s.get(key, kWait);
  return std::string(v.begin(), v.end());
}

// Until `pid` is gone, i.e. the launcher has reaped it (a zombie still
// answers kill(pid, 0)).
bool wait_reaped(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!(::kill(pid, 0) != 0 && errno == ESRCH)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

int fail(int rank, const std::string& what, int code) {
  std::printf("rank %d: CHECK FAILED: %s\n", rank, what.c_str());
  return code;
}

// 3 ranks: 1 fails at once; 0 and 2 read its record; 0 leaves first, then 2
// uses the store (served by the launcher, not by rank 0's process).
int survive(int rank) {
  if (rank == 1) return 3;
  auto s = connect();
  const std::string how = get(*s, "elastic/dead/1");
  std::printf("rank %d: elastic/dead/1 = %s\n", rank, how.c_str());
  if (how != "exit code 3") return fail(rank, "elastic/dead/1 is '" + how + "'", 4);
  if (rank == 0) {
    s->set("test/rank0_pid", std::to_string(::getpid()));
    std::printf("rank 0 leaves first\n");
    return 0;
  }
  if (!wait_reaped(static_cast<pid_t>(std::stol(get(*s, "test/rank0_pid")))))
    return fail(rank, "rank 0 did not exit", 5);
  s->set("test/after_rank0", std::string("yes"));
  const int64_t dead = s->add("elastic/dead_count", 0);
  if (get(*s, "test/after_rank0") != "yes" || dead != 1)
    return fail(rank, "dead_count " + std::to_string(dead), 6);
  std::printf("rank %d used the store after rank 0 exited (dead_count %lld)\n", rank,
              static_cast<long long>(dead));
  return 0;
}

// 2 ranks on two nodes: 1 (node 1) fails at once; 0 reads the record node
// 1's launcher wrote in the store node 0's launcher serves.
int remote(int rank) {
  if (rank == 1) return 3;
  auto s = connect();
  const std::string how = get(*s, "elastic/dead/1");
  std::printf("rank %d: elastic/dead/1 = %s\n", rank, how.c_str());
  return how == "exit code 3" ? 0 : fail(rank, "elastic/dead/1 is '" + how + "'", 4);
}

// 2 ranks: 0 exits 0; 1 fails once the launcher has seen rank 0 end.
int fail_last(int rank) {
  auto s = connect();
  if (rank == 0) {
    s->set("test/rank0_pid", std::to_string(::getpid()));
    return 0;
  }
  if (!wait_reaped(static_cast<pid_t>(std::stol(get(*s, "test/rank0_pid")))))
    return fail(rank, "rank 0 did not exit", 5);
  std::printf("rank %d fails after rank 0 exited 0\n", rank);
  return 3;
}

// 3 ranks: 1 fails in its first start and succeeds when restarted; 0 and 2
// wait for the restarted rank 1.
int restart(int rank) {
  const char* count = std::getenv("DISTOPT_RESTART_COUNT");
  if (rank == 1 && !count) return 3;
  auto s = connect();
  if (rank == 1) {
    const std::string how = get(*s, "elastic/dead/1");
    const int64_t dead = s->add("elastic/dead_count", 0);
    std::printf(
        "rank 1 restarted: DISTOPT_RESTART_COUNT=%s, elastic/dead/1 = %s, dead_count %lld\n", count,
        how.c_str(), static_cast<long long>(dead));
    s->set("test/rank1_back", std::string(count));
    return std::string(count) == "1" && how == "exit code 3" && dead == 1
               ? 0
               : fail(rank, "restart state", 6);
  }
  const std::string back = get(*s, "test/rank1_back");
  const int64_t dead = s->add("elastic/dead_count", 0);
  std::printf("rank %d saw rank 1 back (restart %s), dead_count %lld\n", rank, back.c_str(),
              static_cast<long long>(dead));
  return dead == 1 ? 0 : fail(rank, "dead_count " + std::to_string(dead), 7);
}

// 3 ranks: 1 always fails; 0 and 2 exit 0 once it has been recorded dead
// `deaths` times (argv[2]).
int keep_failing(int rank, int deaths) {
  if (rank == 1) return 3;
  auto s = connect();
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  int64_t dead = 0;
  while ((dead = s->add("elastic/dead_count", 0)) < deaths) {
    if (std::chrono::steady_clock::now() > deadline)
      return fail(rank, "dead_count stays " + std::to_string(dead), 8);
    std::this_thread::sleep_for(10ms);
  }
  std::printf("rank %d saw dead_count %lld\n", rank, static_cast<long long>(dead));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  const int rank = env_int("DISTOPT_RANK", -1);
  try {
    if (scenario == "survive") return survive(rank);
    if (scenario == "fail_last") return fail_last(rank);
    if (scenario == "remote") return remote(rank);
    if (scenario == "restart") return restart(rank);
    if (scenario == "keep_failing" && argc > 2) return keep_failing(rank, std::atoi(argv[2]));
  } catch (const std::exception& e) {
    return fail(rank, e.what(), 9);
  }
  std::fprintf(stderr,
               "usage: launch_elastic_rank survive|remote|fail_last|restart|keep_failing N\n");
  return 2;
}
