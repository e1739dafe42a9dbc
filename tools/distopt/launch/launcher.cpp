// Local launcher: fork/exec N ranks, relay their output line by line with a
// rank prefix, and tear the job down on failure, timeout or interrupt.
#include "launch/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "distopt/threads.hpp"

extern char** environ;

namespace distopt::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Self-pipe: the signal handler only writes the signal number here.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe[1] >= 0) (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

void set_cloexec_nonblock(int fd) {
  fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Write all of buf (retrying on EINTR / partial writes); output errors are
// ignored so a closed terminal never stops the supervision of the ranks.
void write_all(int fd, const std::string& buf) {
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t k = ::write(fd, buf.data() + off, buf.size() - off);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, 100);
        continue;
      }
      return;
    }
    off += static_cast<size_t>(k);
  }
}

// One output stream of one rank: bytes not yet ending in a newline.
struct Stream {
  int fd = -1;     // read end, -1 once closed
  int out_fd = 1;  // where the launcher copies it
  std::string partial;
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream streams[2];
};

constexpr size_t kMaxLine = 64 * 1024;  // flush a line this long even without '\n'

void emit(int rank, Stream& s, bool final) {
  std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(s.partial, start, nl - start + 1);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (!s.partial.empty() && (final || s.partial.size() >= kMaxLine)) {
    out += prefix + s.partial + "\n";
    s.partial.clear();
  }
  if (!out.empty()) write_all(s.out_fd, out);
}

// Read what is available; returns false at EOF / error (stream closed).
bool pump(int rank, Stream& s) {
  char buf[16384];
  for (;;) {
    ssize_t k = ::read(s.fd, buf, sizeof buf);
    if (k > 0) {
      s.partial.append(buf, static_cast<size_t>(k));
      emit(rank, s, false);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    emit(rank, s, true);
    ::close(s.fd);
    s.fd = -1;
    return false;
  }
}

// The child's environment: the parent's, with the launcher's keys replaced.
std::vector<std::string> child_env(const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& v : vars) overridden = overridden || v.first == key;
    if (!overridden) env.push_back(kv);
  }
  for (const auto& v : vars) env.push_back(v.first + "=" + v.second);
  return env;
}

struct SignalGuard {
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old[3];
  struct sigaction old_pipe;
  SignalGuard() {
    if (pipe(g_signal_pipe) != 0)
      throw std::runtime_error("pipe() failed: " + std::string(strerror(errno)));
    set_cloexec_nonblock(g_signal_pipe[0]);
    set_cloexec_nonblock(g_signal_pipe[1]);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old[i]);
    // A reader of our output that goes away must not kill the supervisor.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe);
  }
  ~SignalGuard() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old[i], nullptr);
    sigaction(SIGPIPE, &old_pipe, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
};

std::string seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

void message(const LaunchOptions& o, const std::string& text) {
  write_all(2, o.name + ": " + text + "\n");
}

}  // namespace

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exit code " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    const char* name = sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "unknown status " + std::to_string(st);
}

std::string random_token() {
  std::random_device rd;
  std::string s;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) {
    uint32_t v = rd();
    for (int j = 0; j < 4; ++j) {
      s += hex[(v >> (8 * j + 4)) & 0xf];
      s += hex[(v >> (8 * j)) & 0xf];
    }
  }
  return s.substr(0, 32);
}

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket() failed: " + std::string(strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("cannot bind a loopback port: " + std::string(strerror(e)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// Per-rank environment blocks, made before fork(): after it the children
// make only async-signal-safe calls (the caller may have threads).
struct ChildEnvironments {
  std::vector<std::vector<std::string>> strings;
  std::vector<std::vector<char*>> pointers;  // execvpe's envp, one per rank
};

ChildEnvironments child_environments(const LaunchOptions& o, int port, const std::string& token) {
  const int n = o.nprocs;
  const int world = o.nnodes * n;
  // Ranks sharing the host split its cores unless told otherwise (threads.hpp,
  // the rule Runtime and `distopt train` apply; OpenMP and OpenBLAS read
  // OMP_NUM_THREADS too, so a program without distopt gets it as well).
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const bool set_omp = !(omp && *omp);
  const std::string omp_threads = std::to_string(distopt::default_threads_per_rank(n));
  // Several nodes: name this one for node-aware components (hierarchical),
  // unless the user did; the launcher's node index is what they mean by a node.
  const char* node_id = std::getenv("DISTOPT_NODE_ID");
  const bool set_node = o.nnodes > 1 && !(node_id && *node_id);
  const std::string host = o.master_addr.find(':') != std::string::npos && o.master_addr[0] != '['
                               ? "[" + o.master_addr + "]"
                               : o.master_addr;
  ChildEnvironments e;
  e.strings.resize(n);
  e.pointers.resize(n);
  for (int r = 0; r < n; ++r) {
    std::vector<std::pair<std::string, std::string>> vars = {
        {"DISTOPT_RANK", std::to_string(o.node_rank * n + r)},
        {"DISTOPT_WORLD_SIZE", std::to_string(world)},
        {"DISTOPT_LOCAL_RANK", std::to_string(r)},
        {"DISTOPT_LOCAL_WORLD_SIZE", std::to_string(n)},
        {"DISTOPT_RENDEZVOUS", "tcp://" + host + ":" + std::to_string(port)},
        {"DISTOPT_JOB_TOKEN", token},
    };
    if (set_node) vars.emplace_back("DISTOPT_NODE_ID", "node" + std::to_string(o.node_rank));
    if (!o.config.empty()) vars.emplace_back("DISTOPT_CONFIG", o.config);
    if (set_omp) vars.emplace_back("OMP_NUM_THREADS", omp_threads);
    for (const auto& kv : o.extra_env) vars.push_back(kv);
    e.strings[r] = child_env(vars);
    for (auto& str : e.strings[r]) e.pointers[r].push_back(str.data());
    e.pointers[r].push_back(nullptr);
  }
  return e;
}

// In the forked child: its own process group, killed with the launcher,
// stdin from /dev/null, stdout/stderr into the pipes; never returns.
[[noreturn]] void exec_rank(char* const* argv, char* const* envp, int devnull, int out, int err,
                            pid_t launcher_pid) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher_pid) _exit(1);  // launcher already gone
  // Handlers are reset by exec; signal mask and SIGPIPE disposition are not.
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (devnull >= 0) dup2(devnull, 0);
  dup2(out, 1);
  dup2(err, 2);
  execvpe(argv[0], argv, envp);
  const char* msg = "distopt launch: cannot execute ";
  (void)!write(2, msg, strlen(msg));
  (void)!write(2, argv[0], strlen(argv[0]));
  (void)!write(2, ": ", 2);
  const char* e = strerror(errno);
  (void)!write(2, e, strlen(e));
  (void)!write(2, "\n", 1);
  _exit(127);
}

// The ranks of one job and the policy that supervises them: relay output,
// forward signals, stop the job when a rank fails or time runs out.
class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& o)
      : o_(o), base_(o.node_rank * o.nprocs), ranks_(o.nprocs), running_(0) {}

  void spawn(const ChildEnvironments& env, std::vector<char*>& argv) {
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t launcher_pid = getpid();
    for (int r = 0; r < o_.nprocs; ++r) {
      int out[2], err[2];
      if (pipe(out) != 0 || pipe(err) != 0) abandon("pipe() failed: ");
      pid_t pid = fork();
      if (pid < 0) abandon("fork() failed: ");
      if (pid == 0)
        exec_rank(argv.data(), env.pointers[r].data(), devnull, out[1], err[1], launcher_pid);
      setpgid(pid, pid);  // also from the parent, so kill(-pid) works at once
      ::close(out[1]);
      ::close(err[1]);
      set_cloexec_nonblock(out[0]);
      set_cloexec_nonblock(err[0]);
      ranks_[r].pid = pid;
      ranks_[r].running = true;
      ranks_[r].streams[0] = Stream{out[0], 1, {}};
      ranks_[r].streams[1] = Stream{err[0], 2, {}};
      ++running_;
    }
    if (devnull >= 0) ::close(devnull);
    if (o_.timeout_s > 0) job_deadline_ = after(o_.timeout_s);
  }

  // Until every rank has ended and its output is drained.
  void supervise() {
    while (relay_output()) {
      handle_signals();
      reap();
      enforce_deadlines();
    }
  }

  // Close what grandchildren may still hold open, stop those groups, and
  // turn what happened into the exit code.
  int finish() {
    for (auto& rk : ranks_)
      for (auto& s : rk.streams)
        if (s.fd >= 0) {
          emit(base_ + static_cast<int>(&rk - ranks_.data()), s, true);
          ::close(s.fd);
          s.fd = -1;
        }
    if (terminating_ || interrupted_)
      for (auto& rk : ranks_) ::kill(-rk.pid, SIGKILL);
    if (interrupted_) {
      message(o_, "interrupted; all ranks stopped");
      return kExitInterrupted;
    }
    if (timed_out_) return kExitTimeout;
    if (failed_rank_ >= 0) {
      message(o_, "job failed: rank " + std::to_string(base_ + failed_rank_) + " failed (" +
                      describe_status(ranks_[failed_rank_].status) + ")");
      return kExitRankFailed;
    }
    return kExitOk;
  }

 private:
  static Clock::time_point after(double s) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void signal_all(int sig) {
    for (auto& rk : ranks_)
      if (rk.running) ::kill(-rk.pid, sig);  // the rank's whole process group
  }

  [[noreturn]] void abandon(const std::string& what) {
    const int e = errno;
    signal_all(SIGKILL);
    for (auto& rk : ranks_)
      if (rk.running) waitpid(rk.pid, nullptr, 0);
    throw std::runtime_error(what + strerror(e));
  }

  void begin_terminate(int sig) {
    if (terminating_) return;
    terminating_ = true;
    signal_all(sig);
    kill_at_ = after(o_.grace_s);
  }

  // Poll the signal pipe and every open stream for up to 50 ms and copy what
  // arrived; false once every rank has ended and its output is drained.
  bool relay_output() {
    std::vector<pollfd> pfds;
    std::vector<std::pair<int, int>> source;  // (rank, stream) per pfd
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    source.emplace_back(-1, -1);
    for (int r = 0; r < o_.nprocs; ++r)
      for (int s = 0; s < 2; ++s)
        if (ranks_[r].streams[s].fd >= 0) {
          pfds.push_back({ranks_[r].streams[s].fd, POLLIN, 0});
          source.emplace_back(r, s);
        }
    if (running_ == 0 && (pfds.size() == 1 || Clock::now() >= drain_deadline_)) return false;
    int pr = ::poll(pfds.data(), pfds.size(), 50);
    if (pr < 0 && errno != EINTR)
      throw std::runtime_error("poll() failed: " + std::string(strerror(errno)));
    for (size_t i = 1; pr > 0 && i < pfds.size(); ++i)
      if (pfds[i].revents)
        pump(base_ + source[i].first, ranks_[source[i].first].streams[source[i].second]);
    return true;
  }

  // Signals sent to the launcher: the first is forwarded (Ctrl-C reaches the
  // ranks as SIGINT), a second one kills.
  void handle_signals() {
    unsigned char sigbuf[16];
    ssize_t ns;
    while ((ns = ::read(g_signal_pipe[0], sigbuf, sizeof sigbuf)) > 0) {
      for (ssize_t i = 0; i < ns; ++i) {
        if (interrupted_) {
          signal_all(SIGKILL);  // second interrupt: no more patience
          continue;
        }
        interrupted_ = sigbuf[i];
        const char* abbrev = sigabbrev_np(interrupted_);
        message(o_, "got " +
                        (abbrev ? "SIG" + std::string(abbrev)
                                : "signal " + std::to_string(interrupted_)) +
                        ", stopping " + std::to_string(running_) + " rank(s)");
        if (!terminating_)
          begin_terminate(interrupted_);
        else
          signal_all(SIGTERM);
      }
    }
  }

  // Ranks that ended: the first failure stops the others after failure_wait_s.
  void reap() {
    for (int r = 0; r < o_.nprocs; ++r) {
      Rank& rk = ranks_[r];
      if (!rk.running) continue;
      int st = 0;
      if (waitpid(rk.pid, &st, WNOHANG) != rk.pid) continue;
      rk.running = false;
      rk.status = st;
      --running_;
      // Anything its own children still hold open is drained for a moment,
      // then the group is stopped so nothing outlives the job.
      if (terminating_) ::kill(-rk.pid, SIGKILL);
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && !terminating_ && failed_rank_ < 0 && !interrupted_) {
        failed_rank_ = r;
        message(o_, "rank " + std::to_string(base_ + r) + " failed (" + describe_status(st) + ")" +
                        (running_ > 0 ? ", stopping the other ranks" : ""));
        term_at_ = after(o_.failure_wait_s);
      } else if (!ok && !terminating_ && failed_rank_ >= 0) {
        message(o_,
                "rank " + std::to_string(base_ + r) + " also failed (" + describe_status(st) + ")");
      }
      if (running_ == 0) drain_deadline_ = after(0.5);
    }
  }

  // SIGTERM after a failure or at the job timeout, SIGKILL after the grace.
  void enforce_deadlines() {
    const auto now = Clock::now();
    if (running_ > 0 && now >= term_at_) {
      term_at_ = kNever;
      begin_terminate(SIGTERM);
    }
    if (running_ > 0 && now >= job_deadline_ && !terminating_) {
      timed_out_ = true;
      message(o_, "job timed out after " + seconds(o_.timeout_s) + " s, stopping " +
                      std::to_string(running_) + " rank(s)");
      begin_terminate(SIGTERM);
    }
    if (running_ > 0 && now >= kill_at_) {
      kill_at_ = kNever;
      message(o_, std::to_string(running_) + " rank(s) still running " + seconds(o_.grace_s) +
                      " s after being asked to stop: sending SIGKILL");
      signal_all(SIGKILL);
    }
  }

  static constexpr Clock::time_point kNever = Clock::time_point::max();
  const LaunchOptions& o_;
  const int base_;  // global rank of local rank 0
  std::vector<Rank> ranks_;
  int running_;
  Clock::time_point job_deadline_ = kNever, term_at_ = kNever, kill_at_ = kNever;
  Clock::time_point drain_deadline_ = kNever;
  bool terminating_ = false, timed_out_ = false;
  int interrupted_ = 0;
  int failed_rank_ = -1;
};

}  // namespace

std::pair<std::string, int> split_endpoint(const std::string& ep, const std::string& what) {
  const size_t colon = ep.rfind(':');
  std::string host = colon == std::string::npos ? "" : ep.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : ep.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long p = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
  if (host.empty() || p < 1 || p > 65535 || *end != '\0')
    throw std::invalid_argument(what + " '" + ep + "' is not HOST:PORT (port 1..65535)");
  return {host, static_cast<int>(p)};
}

int run(const LaunchOptions& o) {
  if (o.nprocs < 1) throw std::runtime_error("the number of ranks must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw std::runtime_error("node rank " + std::to_string(o.node_rank) + " is not in [0, " +
                             std::to_string(o.nnodes) + ")");
  if (o.argv.empty()) throw std::runtime_error("no program to launch (give it after --)");
  if (o.nnodes > 1 && o.port <= 0)
    throw std::runtime_error("several nodes need a fixed rendezvous port (--master-port)");
  const int port = o.port > 0 ? o.port : free_loopback_port();
  const std::string token = o.token.empty() ? random_token() : o.token;
  if (o.nnodes > 1)
    message(o, "node " + std::to_string(o.node_rank) + " of " + std::to_string(o.nnodes) +
                   ": ranks " + std::to_string(o.node_rank * o.nprocs) + ".." +
                   std::to_string((o.node_rank + 1) * o.nprocs - 1) + " of " +
                   std::to_string(o.nnodes * o.nprocs) + ", rendezvous tcp://" + o.master_addr +
                   ":" + std::to_string(port));
  const std::string url = "tcp://" + o.master_addr + ":" + std::to_string(port);
  if (!o.config_rendezvous.empty() && o.config_rendezvous != url)
    message(o, o.config_rendezvous_where + ": world.rendezvous '" + o.config_rendezvous +
                   "' is not used: the launched ranks meet at " + url +
                   (o.port > 0 ? "" : " (a free port; --master-port P chooses it)"));
  SignalGuard guard;
  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const ChildEnvironments env = child_environments(o, port, token);
  Supervisor supervisor(o);
  supervisor.spawn(env, argv);
  supervisor.supervise();
  return supervisor.finish();
}

}  // namespace distopt::launch
