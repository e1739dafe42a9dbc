// Test helpers for real multi-process runs on loopback: fork N ranks, or run a
// command line, with a hard timeout so a hanging rank fails the test instead
// of hanging ctest.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distopt::test {

struct ProcResult {
  int exit_code = -1;  ///< exit status, or 128 + signal, or -1 on timeout (then killed)
  std::string output;  ///< stdout and stderr together
  bool timed_out = false;
};

/// A TCP port for a test's rendezvous: random below Linux's ephemeral range
/// (32768+, where the kernel picks the source ports of our own connections),
/// and bindable on 127.0.0.1 right now. A collision with a concurrent test is
/// still possible but rare, and fails loudly, never silently.
inline int random_port() {
  std::random_device rd;
  for (int attempt = 0;; ++attempt) {
    int port = 20000 + static_cast<int>(rd() % 12000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the store server binds
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (ok || attempt > 50) return port;
  }
}

/// Whether this process runs a thread whose name starts with `prefix`
/// (/proc/self/task/*/comm).
inline bool has_thread_named(const std::string& prefix) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
    if (FILE* f = fopen(path.c_str(), "r")) {
      char name[64] = {0};
      if (fgets(name, sizeof name, f) && std::string(name).rfind(prefix, 0) == 0) found = true;
      fclose(f);
    }
    if (found) break;
  }
  closedir(d);
  return found;
}

/// Fork `n` children; child r runs fn(r) and exits with its return value (an
/// uncaught exception exits 99 after printing). Waits for all with a timeout
/// (children still running are SIGKILLed and reported as -1).
///
/// Throws std::logic_error when the calling process already ran a backward
/// on a machine with a GPU: libtorch's autograd engine then runs one thread
/// per device ("pt_autograd_N"), which a forked child does not inherit, and
/// a backward in the child waits for it forever (seen on the H200,
/// grad_accum_test, 2026-11-26). Compute single-process references in a
/// child too (fork_ranks(1, ...)), or after the last fork.
inline std::vector<int> fork_ranks(int n, const std::function<int(int)>& fn,
                                   std::chrono::seconds timeout = std::chrono::seconds(120)) {
  if (has_thread_named("pt_autograd_"))
    throw std::logic_error(
        "fork_ranks: this process already ran a backward with a GPU present (libtorch's "
        "autograd device threads, pt_autograd_*, are running); a forked rank's backward would "
        "wait for them forever. Run the single-process reference in a child (fork_ranks(1, "
        "...)) or after the ranks");
  std::vector<pid_t> pids;
  // Unflushed parent output would otherwise be printed again by every child.
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 98;
      try {
        rc = fn(r);
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: uncaught exception: %s\n", r, e.what());
        rc = 99;
      }
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(n, -1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] <= 0) continue;
      int st = 0;
      pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) {
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[r] = -1;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          codes[r] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

/// Run argv with extra environment entries ("K=V"), capturing output.
inline ProcResult run_command(const std::vector<std::string>& argv,
                              const std::vector<std::string>& env = {},
                              std::chrono::seconds timeout = std::chrono::seconds(120)) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    for (const auto& kv : env) putenv(strdup(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    fprintf(stderr, "exec %s failed\n", args[0]);
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  ProcResult res;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  bool eof = false;
  while (!eof) {
    pollfd p{fds[0], POLLIN, 0};
    poll(&p, 1, 50);
    ssize_t k;
    while ((k = read(fds[0], buf, sizeof buf)) > 0) res.output.append(buf, static_cast<size_t>(k));
    if (k == 0) eof = true;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      res.timed_out = true;
      break;
    }
  }
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (res.timed_out)
    res.exit_code = -1;
  else
    res.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return res;
}

/// Path from an environment variable ctest sets (see tests/CMakeLists.txt).
inline std::string env_path(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace distopt::test
