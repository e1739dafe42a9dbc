// Helpers of the CLI integration tests: the CLI path, temporary directories,
// a background process the test can signal, process liveness.
#pragma once

#include <dirent.h>
#include <doctest/doctest.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>  // multiproc.hpp uses strdup without including it
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "multiproc.hpp"
#include "result_files.hpp"

namespace distopt::test::cli {

inline std::string cli() {
  std::string c = env_path("DISTOPT_CLI");
  REQUIRE_MESSAGE(!c.empty(), "DISTOPT_CLI is not set (run through ctest)");
  return c;
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/distopt_cli_test_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { remove_tree(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

/// Alive = exists and is not a zombie (a killed orphan may wait for a reaper).
inline bool process_exists(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= text.size())
    return false;  // gone meanwhile
  return text[close_paren + 2] != 'Z';
}

/// Pids of the live children of `parent` (from /proc).
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end || pid <= 0) continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string text;
    std::getline(stat, text);
    size_t p = text.rfind(')');
    if (p == std::string::npos) continue;
    std::istringstream rest(text.substr(p + 2));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

/// A command started in the background with its output on a pipe, so the
/// test can signal it while it runs.
struct Background {
  pid_t pid = -1;
  int fd = -1;
  std::string output;

  explicit Background(const std::vector<std::string>& argv) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      setpgid(0, 0);
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    fd = fds[0];
    fcntl(fd, F_SETFL, O_NONBLOCK);
  }
  ~Background() {
    if (fd >= 0) {  // the test failed before wait(): leave nothing running
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      close(fd);
    }
  }
  /// Read output until `pred(output)` holds, EOF, or the limit (a hang guard).
  template <class Pred>
  bool read_until(Pred pred, std::chrono::seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    while (!pred(output)) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, 50);
      ssize_t k;
      while ((k = read(fd, buf, sizeof buf)) > 0) output.append(buf, static_cast<size_t>(k));
      if (k == 0) return pred(output);
    }
    return true;
  }
  /// Wait for exit (hang guard: SIGKILL the group after `limit`); returns the
  /// exit code, 128 + signal, or -1 if it had to be killed.
  int wait(std::chrono::seconds limit) {
    read_until([](const std::string&) { return false; }, limit);  // until EOF or limit
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int st = 0;
    for (;;) {
      pid_t w = waitpid(pid, &st, WNOHANG);
      if (w == pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
        close(fd);
        fd = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    close(fd);
    fd = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
};

}  // namespace distopt::test::cli
