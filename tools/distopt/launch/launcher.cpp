// Local launcher: fork/exec N ranks, relay their output line by line with a
// rank prefix, and tear the job down on failure, timeout or interrupt (elastic:
// serve the store, record a failed rank there, restart it, go on).
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
#include <thread>
#include <vector>

#include "distopt/elastic_membership.hpp"
#include "distopt/error.hpp"
#include "distopt/store.hpp"
#include "distopt/threads.hpp"
#include "launch/outcome.hpp"

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

// One output stream of one rank process: bytes not yet ending in a newline.
// A restarted rank's old streams are drained beside its new ones.
struct Stream {
  int fd = -1;     // read end, -1 once closed
  int out_fd = 1;  // where the launcher copies it
  int rank = 0;    // local rank
  std::string partial;
  int shown = -1;  // the rank the process says it is now (elastic renumbering), else -1
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int restarts = 0;     // elastic: times this rank was restarted
  int64_t member = -1;  // elastic: the current process's member id (DISTOPT_ELASTIC_MEMBER)
};

constexpr size_t kMaxLine = 64 * 1024;  // flush a line this long even without '\n'

// A rank's progress line begins with '\r' (distopt train's step lines when
// DISTOPT_PROGRESS=1). On a terminal the launcher draws it over the last
// progress line instead of scrolling, and the next ordinary line (the
// epoch's result) replaces it; elsewhere the '\r' is dropped, so logs stay
// line-based. One terminal line for all ranks: the launcher's own.
bool g_stdout_tty = false;     // the launcher's stdout is a terminal
bool g_stderr_tty = false;     // and its stderr
bool g_progress_open = false;  // a progress line is on the terminal, not ended

// A line "\x1b]distopt-rank=N\x07" (kRankLine; a rank prints it after an
// elastic membership change renumbered it) is not copied: it makes the
// stream's later lines "[rank N] ".
constexpr char kRankLine[] = "\x1b]distopt-rank=";

void emit(int rank, Stream& s, bool final) {
  std::string prefix = "[rank " + std::to_string(s.shown >= 0 ? s.shown : rank) + "] ";
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    if (s.partial.compare(start, sizeof kRankLine - 1, kRankLine) == 0) {
      s.shown = std::atoi(s.partial.c_str() + start + sizeof kRankLine - 1);
      prefix = "[rank " + std::to_string(s.shown) + "] ";
      start = nl + 1;
      continue;
    }
    const bool tty = s.out_fd == 1 ? g_stdout_tty : g_stderr_tty;
    const bool progress = s.partial[start] == '\r';
    if (progress) ++start;
    if (tty && (progress || g_progress_open)) out += "\r\x1b[K";
    out += prefix;
    if (progress && tty) {
      out.append(s.partial, start, nl - start);  // no newline: the next line overwrites it
      g_progress_open = true;
    } else {
      out.append(s.partial, start, nl - start + 1);
      g_progress_open = false;
    }
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

// The child's environment: the parent's, with the launcher's keys replaced
// and the keys in `drop` removed.
std::vector<std::string> child_env(const std::vector<std::pair<std::string, std::string>>& vars,
                                   const std::vector<std::string>& drop) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    bool overridden = std::find(drop.begin(), drop.end(), key) != drop.end();
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

// One rank's environment block, made before fork(): after it the child
// makes only async-signal-safe calls (the launcher has threads: the store).
struct ChildEnvironment {
  std::vector<std::string> strings;
  std::vector<char*> pointers() {  // execvpe's envp, valid while `strings` is unchanged
    std::vector<char*> p;
    for (auto& str : strings) p.push_back(str.data());
    p.push_back(nullptr);
    return p;
  }
};

// The launcher's variables of local rank r; restarts > 0 adds DISTOPT_RESTART_COUNT,
// member >= 0 (elastic) DISTOPT_ELASTIC_MEMBER.
// torch_port: MASTER_PORT, where a PyTorch script's env:// rendezvous
// (torch.distributed's TCPStore on rank 0) listens.
ChildEnvironment child_environment(const LaunchOptions& o, int r, int port, int torch_port,
                                   const std::string& token, int restarts, int64_t member) {
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
  const bool set_node = (o.nnodes > 1 || o.max_nodes > 0) && !(node_id && *node_id);
  const std::string host = o.master_addr.find(':') != std::string::npos && o.master_addr[0] != '['
                               ? "[" + o.master_addr + "]"
                               : o.master_addr;
  std::vector<std::pair<std::string, std::string>> vars = {
      {"DISTOPT_RANK", std::to_string(o.node_rank * n + r)},
      {"DISTOPT_WORLD_SIZE", std::to_string(world)},
      {"DISTOPT_LOCAL_RANK", std::to_string(r)},
      {"DISTOPT_LOCAL_WORLD_SIZE", std::to_string(n)},
      {"DISTOPT_RENDEZVOUS", "tcp://" + host + ":" + std::to_string(port)},
      {"DISTOPT_JOB_TOKEN", token},
  };
  if (set_node) vars.emplace_back("DISTOPT_NODE_ID", "node" + std::to_string(o.node_rank));
  // torchrun's variables, so that a PyTorch script's env:// rendezvous
  // (dist.init_process_group) works under this launcher as under torchrun.
  vars.insert(vars.end(), {{"RANK", std::to_string(o.node_rank * n + r)},
                           {"WORLD_SIZE", std::to_string(world)},
                           {"LOCAL_RANK", std::to_string(r)},
                           {"LOCAL_WORLD_SIZE", std::to_string(n)},
                           {"GROUP_RANK", std::to_string(o.node_rank)},
                           {"MASTER_ADDR", o.master_addr},
                           {"MASTER_PORT", std::to_string(torch_port)}});
  // A rank renumbered by an elastic membership change says so (emit()).
  vars.emplace_back("DISTOPT_LAUNCHER_PREFIX", "1");
  // distopt train draws its step lines as one progress line (emit()).
  vars.emplace_back("DISTOPT_PROGRESS", g_stdout_tty ? "1" : "0");
  if (!o.config.empty()) vars.emplace_back("DISTOPT_CONFIG", o.config);
  if (set_omp) {
    // The launcher's guess (its own ranks only): distopt ranks size their
    // threads again by the ranks that share the cores once all have met.
    vars.emplace_back("OMP_NUM_THREADS", omp_threads);
    vars.emplace_back("DISTOPT_THREADS_AUTO", "1");
  }
  // Elastic: the launcher serves the store. Otherwise an elastic job's
  // variables inherited from an enclosing launch would leave rank 0 waiting
  // for a server nobody starts.
  std::vector<std::string> drop = {"DISTOPT_RESTART_COUNT", membership::kEnvMember};
  if (o.elastic) {
    if (member >= 0) vars.emplace_back(membership::kEnvMember, std::to_string(member));
    vars.emplace_back("DISTOPT_STORE_SERVED", "1");
    vars.emplace_back(membership::kEnvAgent, "1");
    if (restarts > 0) vars.emplace_back("DISTOPT_RESTART_COUNT", std::to_string(restarts));
    if (o.join) vars.emplace_back(membership::kEnvJoin, "1");
  } else {
    drop.insert(drop.end(), {"DISTOPT_STORE_SERVED", membership::kEnvAgent});
  }
  if (!o.elastic || !o.join) drop.push_back(membership::kEnvJoin);
  for (const auto& kv : o.extra_env) vars.push_back(kv);
  return ChildEnvironment{child_env(vars, drop)};
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
// forward signals, stop the job when a rank fails (elastic: record it, maybe
// restart it, go on) or time runs out.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, int port, int torch_port, std::string token,
             std::vector<char*> argv)
      : o_(o),
        base_(o.node_rank * o.nprocs),
        port_(port),
        torch_port_(torch_port),
        token_(std::move(token)),
        argv_(std::move(argv)),
        ranks_(o.nprocs),
        running_(0),
        outcome_(o.elastic, o.max_restarts) {}

  void spawn() {
    for (int r = 0; r < o_.nprocs; ++r) {
      if (o_.elastic) {
        try {
          assign_member(r);
        } catch (const std::exception& e) {
          stop_started();
          throw std::runtime_error("elastic: no member id for rank " + std::to_string(base_ + r) +
                                   " from the store at " + store_url() + ": " + e.what());
        }
      }
      start(r);
    }
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
    for (auto& s : streams_)
      if (s.fd >= 0) {
        emit(base_ + s.rank, s, true);
        ::close(s.fd);
        s.fd = -1;
      }
    if (terminating_ || interrupted_)
      for (auto& rk : ranks_) ::kill(-rk.pid, SIGKILL);
    const int code = outcome_.exit_code(interrupted_ != 0, timed_out_);
    const int failed = outcome_.deciding_failure();
    if (interrupted_) {
      message(o_, "interrupted; all ranks stopped");
    } else if (code == kExitOk && o_.elastic && outcome_.failures() > 0) {
      message(o_, "elastic: " + std::to_string(outcome_.failures()) +
                      " rank failure(s); the ranks that ended last exited 0");
    } else if (code == kExitRankFailed && failed < 0) {
      message(o_, "job failed: no rank exited 0");
    } else if (code == kExitRankFailed) {
      message(o_, "job failed: rank " + std::to_string(base_ + failed) + " failed (" +
                      describe_status(ranks_[failed].status) + ")" +
                      (!o_.elastic                 ? ""
                       : outcome_.none_exited_ok() ? " and no rank exited 0"
                                                   : " at or after the last rank that exited 0"));
    }
    return code;
  }

 private:
  static Clock::time_point after(double s) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Fork and exec local rank r (again, when it is restarted).
  void start(int r) {
    Rank& rk = ranks_[r];
    ChildEnvironment env =
        child_environment(o_, r, port_, torch_port_, token_, rk.restarts, rk.member);
    std::vector<char*> envp = env.pointers();
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t launcher_pid = getpid();
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) abandon("pipe() failed: ");
    pid_t pid = fork();
    if (pid < 0) abandon("fork() failed: ");
    if (pid == 0) exec_rank(argv_.data(), envp.data(), devnull, out[1], err[1], launcher_pid);
    setpgid(pid, pid);  // also from the parent, so kill(-pid) works at once
    ::close(out[1]);
    ::close(err[1]);
    if (devnull >= 0) ::close(devnull);
    set_cloexec_nonblock(out[0]);
    set_cloexec_nonblock(err[0]);
    rk.pid = pid;
    rk.running = true;
    streams_.push_back(Stream{out[0], 1, r, {}});
    streams_.push_back(Stream{err[0], 2, r, {}});
    ++running_;
  }

  void signal_all(int sig) {
    for (auto& rk : ranks_)
      if (rk.running) ::kill(-rk.pid, sig);  // the rank's whole process group
  }

  void stop_started() {
    signal_all(SIGKILL);
    for (auto& rk : ranks_)
      if (rk.running) waitpid(rk.pid, nullptr, 0);
  }

  [[noreturn]] void abandon(const std::string& what) {
    const int e = errno;
    stop_started();
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
    streams_.erase(
        std::remove_if(streams_.begin(), streams_.end(), [](const Stream& s) { return s.fd < 0; }),
        streams_.end());
    std::vector<pollfd> pfds;
    pfds.push_back({g_signal_pipe[0], POLLIN, 0});
    for (const auto& s : streams_) pfds.push_back({s.fd, POLLIN, 0});
    if (running_ == 0 && (pfds.size() == 1 || Clock::now() >= drain_deadline_)) return false;
    int pr = ::poll(pfds.data(), pfds.size(), 50);
    if (pr < 0 && errno != EINTR)
      throw std::runtime_error("poll() failed: " + std::string(strerror(errno)));
    for (size_t i = 1; pr > 0 && i < pfds.size(); ++i)
      if (pfds[i].revents) pump(base_ + streams_[i - 1].rank, streams_[i - 1]);
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

  // Ranks that ended: the first failure stops the others after failure_wait_s
  // (elastic: is recorded in the store, and the rank restarted while allowed).
  void reap() {
    bool any = false;
    for (int r = 0; r < o_.nprocs; ++r) {
      Rank& rk = ranks_[r];
      if (!rk.running) continue;
      int st = 0;
      if (waitpid(rk.pid, &st, WNOHANG) != rk.pid) continue;
      if (!any) outcome_.begin_sweep();
      any = true;
      rk.running = false;
      rk.status = st;
      --running_;
      // Anything its own children still hold open is drained for a moment,
      // then the group is stopped so nothing outlives the job.
      if (terminating_) ::kill(-rk.pid, SIGKILL);
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      const std::string who = std::to_string(base_ + r);
      switch (outcome_.ended(r, ok, terminating_, interrupted_ != 0)) {
        case EndAction::kNone:
          break;
        case EndAction::kStopOthers:
          message(o_, "rank " + who + " failed (" + describe_status(st) + ")" +
                          (running_ > 0 ? ", stopping the other ranks" : ""));
          term_at_ = after(o_.failure_wait_s);
          break;
        case EndAction::kAlsoFailed:
          message(o_, "rank " + who + " also failed (" + describe_status(st) + ")");
          break;
        case EndAction::kRecordDead:
          elastic_failed(r, st, false);
          break;
        case EndAction::kRestart:
          elastic_failed(r, st, true);
          break;
      }
    }
    if (any && running_ == 0) drain_deadline_ = after(0.5);
  }

  // Elastic: a rank process failed on its own. The failure is recorded in
  // the store (for the survivors to agree on a new membership) and, while
  // restarts are left (outcome_), the rank is started again.
  void elastic_failed(int r, int st, bool restart) {
    const std::string who = std::to_string(base_ + r);
    message(o_, "rank " + who + " failed (" + describe_status(st) +
                    "); elastic: the other ranks go on");
    // Under the member id the process was started with (assign_member), so
    // the survivors' agreement counts exactly this process as gone.
    record_dead(ranks_[r].member, describe_status(st));
    if (!restart) return;
    Rank& rk = ranks_[r];
    ::kill(-rk.pid, SIGKILL);  // what the dead process left in its group
    ++rk.restarts;
    try {
      assign_member(r);
    } catch (const std::exception& e) {
      outcome_.restart_failed();
      store_.reset();
      message(o_, "elastic: rank " + who + " is not restarted: no member id from the store at " +
                      store_url() + ": " + e.what());
      return;
    }
    message(o_, "restarting rank " + who +
                    " (DISTOPT_RESTART_COUNT=" + std::to_string(rk.restarts) + "; restart " +
                    std::to_string(outcome_.restarts()) + " of at most " +
                    std::to_string(o_.max_restarts) + " on this node)");
    start(r);
  }

  std::string store_url() const { return "tcp://" + o_.master_addr + ":" + std::to_string(port_); }

  // The launcher's client connection to the job's store (node 0's launcher
  // serves it), made at first use; throws RendezvousError.
  Store& store() {
    if (!store_) {
      StoreOptions so;
      so.url = store_url();
      so.rank = base_;
      so.world_size = o_.nnodes * o_.nprocs;
      so.token = token_;
      so.serve = false;
      // Node 0's store is up before its ranks start; another node (or a
      // joining launcher) waits this long for it, relaying no output.
      so.timeout = std::chrono::seconds(o_.join ? 60 : 10);
      store_ = make_store(so);
    }
    return *store_;
  }

  // Elastic: the member id the next process of local rank r is known by in
  // the job's membership (distopt/elastic_membership.hpp), handed to it as
  // DISTOPT_ELASTIC_MEMBER so that its death is recorded under that id: a
  // starting rank's from its global rank and restarts, a joining process's
  // (join) a new one from the store each time. Throws RendezvousError when
  // the store cannot be reached for the number.
  void assign_member(int r) {
    Rank& rk = ranks_[r];
    rk.member = o_.join ? membership::joining_member_id(store())
                        : membership::member_id(base_ + r, rk.restarts);
  }

  // The record survivors read (membership::record_dead); a store that cannot
  // be reached is reported, and the survivors wait elastic.settle_s instead.
  void record_dead(int64_t member, const std::string& how) {
    try {
      membership::record_dead(store(), member, how);
    } catch (const std::exception& e) {
      store_.reset();  // try to connect again at the next failure
      message(o_, "elastic: cannot record member " + std::to_string(member) +
                      "'s failure in the store at " + store_url() + ": " + e.what());
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
  const int port_;
  const int torch_port_;
  const std::string token_;
  std::vector<char*> argv_;
  std::vector<Rank> ranks_;
  std::vector<Stream> streams_;
  int running_;
  Clock::time_point job_deadline_ = kNever, term_at_ = kNever, kill_at_ = kNever;
  Clock::time_point drain_deadline_ = kNever;
  bool terminating_ = false, timed_out_ = false;
  int interrupted_ = 0;
  JobOutcome outcome_;            // which end stops the job, which rank restarts, the exit code
  std::shared_ptr<Store> store_;  // elastic: the launcher's client, made at the first failure
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

namespace {

std::chrono::milliseconds millis(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// The launcher serving the node rendezvous decides when the job starts and
// with how many nodes (LaunchOptions::max_nodes); returns that number.
int64_t decide_start(Store& store, const LaunchOptions& o) {
  const auto deadline = Clock::now() + millis(o.rdzv_timeout_s);
  auto settle_end = Clock::time_point::max();
  for (;;) {
    const int64_t n = store.add(membership::kNodesArrived, 0);
    const auto now = Clock::now();
    if (n >= o.min_nodes && settle_end == Clock::time_point::max()) {
      settle_end = now + millis(o.rdzv_settle_s);
      message(o, "elastic nodes: " + std::to_string(n) + " of at least " +
                     std::to_string(o.min_nodes) + " arrived; starting in " +
                     seconds(o.rdzv_settle_s) + " s unless " + std::to_string(o.max_nodes) +
                     " arrive sooner");
    }
    if (n >= o.max_nodes || now >= settle_end) break;
    if (now >= deadline)
      throw std::runtime_error("elastic nodes: " + std::to_string(n) + " of at least " +
                               std::to_string(o.min_nodes) + " node(s) arrived at tcp://" +
                               o.master_addr + ":" + std::to_string(o.port) + " within " +
                               seconds(o.rdzv_timeout_s) + " s (--rdzv-timeout)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t started = std::min<int64_t>(store.add(membership::kNodesArrived, 0), o.max_nodes);
  store.set(membership::kNodesStarted, std::to_string(started));
  return started;
}

// Elastic nodes: the node rendezvous of LaunchOptions::max_nodes. Fills in
// o.nnodes, o.node_rank, o.join and the ranks' DISTOPT_ELASTIC_MAX_RANKS;
// returns the store server when this launcher serves it.
std::unique_ptr<StoreServer> node_rendezvous(LaunchOptions& o) {
  if (!o.elastic || o.join || o.port <= 0 || o.token.empty() || o.min_nodes < 1 ||
      o.max_nodes < o.min_nodes)
    throw std::runtime_error(
        "elastic nodes need elastic, not join, a fixed port, a token and 1 <= min_nodes <= "
        "max_nodes");
  std::unique_ptr<StoreServer> server;
  if (!o.node_rank_given || o.node_rank == 0) {
    try {
      server = StoreServer::start(o.master_addr, o.port, o.token);
    } catch (const RendezvousError&) {
      // The port is taken (another node's launcher on this host serves it)
      // or the address is another host's: a client, unless named node 0.
      if (o.node_rank_given) throw;
    }
  }
  const std::string url = "tcp://" + o.master_addr + ":" + std::to_string(o.port);
  StoreOptions so;
  so.url = url;
  so.token = o.token;
  so.serve = false;
  so.timeout = millis(o.rdzv_timeout_s);
  std::shared_ptr<Store> store = make_store(so);
  const int64_t arrival = store->add(membership::kNodesArrived, 1);
  message(o, "elastic nodes: arrived " + std::to_string(arrival) + (server ? "" : " at " + url) +
                 (server ? " (serving the store at " + url + ")" : "") + "; the job starts with " +
                 std::to_string(o.min_nodes) + ".." + std::to_string(o.max_nodes) + " node(s)");
  const int64_t started = server ? decide_start(*store, o) : std::stoll([&] {
    const auto v = store->get(membership::kNodesStarted, millis(o.rdzv_timeout_s));
    return std::string(v.begin(), v.end());
  }());
  if (arrival <= started) {
    if (!o.node_rank_given) o.node_rank = static_cast<int>(arrival - 1);
    if (o.node_rank >= started)
      throw std::runtime_error("--node-rank " + std::to_string(o.node_rank) + ", but the job " +
                               "started with " + std::to_string(started) + " node(s)");
    o.nnodes = static_cast<int>(started);
  } else {
    // After the start: this node's ranks join the running job (their
    // global numbers are only names).
    if (!o.node_rank_given) o.node_rank = static_cast<int>(arrival - 1);
    o.nnodes = o.node_rank + 1;
    o.join = true;
    message(o, "elastic nodes: the job started with " + std::to_string(started) +
                   " node(s) before this one arrived: its ranks join the running job");
  }
  o.extra_env.emplace_back(membership::kEnvMaxRanks,
                           std::to_string(static_cast<int64_t>(o.max_nodes) * o.nprocs));
  return server;
}

}  // namespace

int run(const LaunchOptions& given) {
  LaunchOptions o = given;
  std::unique_ptr<StoreServer> server;
  if (o.max_nodes > 0) {
    if (o.nprocs < 1) throw std::runtime_error("the number of ranks must be at least 1");
    server = node_rendezvous(o);
  }
  if (o.nprocs < 1) throw std::runtime_error("the number of ranks must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw std::runtime_error("node rank " + std::to_string(o.node_rank) + " is not in [0, " +
                             std::to_string(o.nnodes) + ")");
  if (o.argv.empty()) throw std::runtime_error("no program to launch (give it after --)");
  if (o.nnodes > 1 && o.port <= 0)
    throw std::runtime_error("several nodes need a fixed rendezvous port (--master-port)");
  if (o.max_restarts < 0 || (o.max_restarts > 0 && !o.elastic))
    throw std::runtime_error("max_restarts " + std::to_string(o.max_restarts) +
                             ": restarts need elastic and a count >= 0");
  if (o.join && (!o.elastic || o.port <= 0 || o.token.empty()))
    throw std::runtime_error("join needs elastic, the running job's rendezvous port and its token");
  const std::string token = o.token.empty() ? random_token() : o.token;
  // Elastic: node 0's launcher serves the store before any rank starts (a
  // port it picks itself is bound at once, so no other process can take it).
  if (o.elastic && o.node_rank == 0 && !o.join && o.max_nodes == 0)
    server = StoreServer::start(o.master_addr, o.port, token);
  const int port = server ? server->port() : o.port > 0 ? o.port : free_loopback_port();
  if (o.nnodes > 1)
    message(o, "node " + std::to_string(o.node_rank) + " of " + std::to_string(o.nnodes) +
                   ": ranks " + std::to_string(o.node_rank * o.nprocs) + ".." +
                   std::to_string((o.node_rank + 1) * o.nprocs - 1) + " of " +
                   std::to_string(o.nnodes * o.nprocs) + ", rendezvous tcp://" + o.master_addr +
                   ":" + std::to_string(port));
  const std::string url = "tcp://" + o.master_addr + ":" + std::to_string(port);
  // MASTER_PORT for PyTorch scripts: the rendezvous port + 1 when it is fixed
  // (every node's launcher agrees), else another free port.
  int torch_port = o.port > 0 ? port + 1 : free_loopback_port();
  while (torch_port == port) torch_port = free_loopback_port();
  // An elastic job's first launcher: what a rank started later needs to join.
  if (o.elastic && o.node_rank == 0 && !o.join && o.max_nodes == 0)
    message(o, "elastic: more ranks join with `distopt launch --elastic --join --master-addr " +
                   o.master_addr + " --master-port " + std::to_string(port) + " --rdzv-id " +
                   token + " -- PROGRAM...`");
  if (!o.config_rendezvous.empty() && o.config_rendezvous != url)
    message(o, o.config_rendezvous_where + ": world.rendezvous '" + o.config_rendezvous +
                   "' is not used: the launched ranks meet at " + url +
                   (o.port > 0 ? "" : " (a free port; --master-port P chooses it)"));
  SignalGuard guard;
  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  g_stdout_tty = ::isatty(1) == 1;
  g_stderr_tty = ::isatty(2) == 1;
  Supervisor supervisor(o, port, torch_port, token, std::move(argv));
  supervisor.spawn();
  supervisor.supervise();
  return supervisor.finish();
}

}  // namespace distopt::launch
