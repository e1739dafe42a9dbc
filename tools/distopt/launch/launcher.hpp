// A local launcher: starts N ranks of a program on this host with the
// environment distopt (core/include/distopt/process.hpp) reads, prefixes their
// output with the rank, and stops the whole job when one rank fails or when
// the launcher is interrupted. Elastic (LaunchOptions::elastic): it serves the
// rendezvous store itself, so the store outlives any rank, records a dead rank
// there and lets the others go on (they agree on a new membership through the
// store; core's business). Used by `distopt launch` and by `distopt train`
// when it starts its own ranks. Torch-free.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace distopt::launch {

/// Exit codes of run() (also the exit codes of `distopt launch`).
/// Elastic (LaunchOptions::elastic), from the rank processes of this node the
/// launcher saw end last (those it reaps in the same pass of its 50 ms poll
/// loop count as ending together; a restarted rank counts by its last process):
/// kExitOk when at least one rank exited 0 and no rank failed at or after the
/// last exit 0 seen, else kExitRankFailed (every rank failed, or a failure
/// came last). Each node's launcher judges its own ranks only.
constexpr int kExitOk = 0;             ///< every rank exited 0 (elastic: the ranks that ended last)
constexpr int kExitRankFailed = 1;     ///< a rank exited non-zero or was killed by a signal
constexpr int kExitTimeout = 124;      ///< the job ran past LaunchOptions::timeout_s
constexpr int kExitInterrupted = 130;  ///< the launcher got SIGINT / SIGTERM / SIGHUP

struct LaunchOptions {
  int nprocs = 1;                 ///< ranks to start on this node (>= 1)
  std::vector<std::string> argv;  ///< program and its arguments; argv[0] is searched in $PATH
  std::string config;             ///< exported as DISTOPT_CONFIG when non-empty
  /// Nodes of the job and this node's index: local rank i gets global rank
  /// node_rank * nprocs + i of nnodes * nprocs (torchrun's numbering).
  int nnodes = 1;
  int node_rank = 0;
  /// The rendezvous: rank 0 (on node 0) serves the store at master_addr:port.
  std::string master_addr = "127.0.0.1";
  int port = 0;  ///< rendezvous port; 0 = pick a free one (one node only)
  /// The job token; "" = a random one (one node only: several nodes must
  /// share it, so there the caller chooses it).
  std::string token;
  /// The job file's own world.rendezvous URL and where it is written
  /// ("job.yaml:3"), "" when the file sets none. The launcher's rendezvous
  /// replaces it (DISTOPT_RENDEZVOUS wins in every rank): run() says so
  /// once, on stderr, when the two differ.
  std::string config_rendezvous, config_rendezvous_where;
  double timeout_s = 0;  ///< stop the job after this many seconds; 0 = no limit
  /// After the first rank fails, the others get this long to exit on their
  /// own (so a surviving rank can report, e.g., which peer died) before
  /// they are sent SIGTERM. Interrupts are forwarded without this wait.
  /// The default covers the collective check's wait for a dead peer's post
  /// (at most 3 s) plus a second to report.
  double failure_wait_s = 4.0;
  double grace_s = 5.0;  ///< SIGTERM -> SIGKILL delay, seconds
  std::vector<std::pair<std::string, std::string>> extra_env;  ///< set in every rank
  /// Elastic training: a rank that fails does not stop the others.
  /// Node 0's launcher serves the store (StoreServer on master_addr:port,
  /// the job token) before starting its ranks; every rank of every node gets
  /// DISTOPT_STORE_SERVED=1 (rank 0 connects as a client only) and
  /// DISTOPT_ELASTIC=1, and each process DISTOPT_ELASTIC_MEMBER, its member
  /// id in the job's membership (membership::member_id of its global rank
  /// and restarts; with `join`, membership::joining_member_id, taken before
  /// the process starts: distopt/elastic_membership.hpp). For a local rank r
  /// (global number) whose process exits non-zero or is killed, the
  /// launcher, as a store client, records it (membership::record_dead, with
  /// describe_status(): "exit code 3"), then says "rank r failed
  /// (exit code 3); elastic: the other ranks go on" on stderr. It waits for every rank; see
  /// kExitOk for the exit code. Interrupts and timeout_s stop every rank as
  /// without elastic, and failure_wait_s is unused.
  bool elastic = false;
  /// Elastic only (run() throws otherwise): restart a failed local rank,
  /// after it is recorded dead, at most this many times in all on this node
  /// (>= 0). The new process has the same global rank and environment plus
  /// DISTOPT_RESTART_COUNT = how many times this rank has been restarted (1
  /// for its first restart; unset in first starts). Whether it can rejoin
  /// the job is for the program (core) to arrange.
  int max_restarts = 0;
  /// Elastic only: the ranks started here join a running elastic job at
  /// master_addr:port (whose token must be given): this launcher serves no
  /// store, and its ranks get DISTOPT_ELASTIC_JOIN=1, which makes the core
  /// ask the running ranks to take them in at their next commit (core's
  /// Runtime::joining). Their global numbers are only names. run() throws
  /// std::runtime_error when the store cannot be reached within 60 s.
  bool join = false;
  /// Elastic nodes (torchrun's --nnodes MIN:MAX), when max_nodes > 0:
  /// elastic, port and token required, join false. Before starting its
  /// ranks, each node's launcher takes part in a node rendezvous at
  /// master_addr:port. It serves the store there itself when it can bind that
  /// address (the first launcher on the master's host; with node_rank_given,
  /// only node 0's, which must bind it), else it is a client. Each launcher
  /// adds 1 to the store counter elastic/nodes/arrived (its arrival number
  /// a, from 1); the one serving the store waits until min_nodes have
  /// arrived, then rdzv_settle_s more seconds or until max_nodes have, and
  /// sets elastic/nodes/started = N, the arrivals so far (at most max_nodes).
  /// A launcher with a <= N runs node a - 1 (or node_rank, if given, which
  /// must then be < N) of N; one with a > N (it came after the start) starts
  /// its ranks with join, as node a - 1 (or node_rank). Every rank gets
  /// DISTOPT_ELASTIC_MAX_RANKS = max_nodes * nprocs: the running ranks take
  /// joining ones in up to that world size unless the job file sets
  /// elastic.max_ranks. run() throws std::runtime_error when fewer than
  /// min_nodes arrive, or no start is decided, within rdzv_timeout_s.
  int min_nodes = 0, max_nodes = 0;
  bool node_rank_given = false;  ///< node_rank was given (else: arrival order)
  double rdzv_settle_s = 3;
  double rdzv_timeout_s = 600;
  std::string name = "distopt launch";  ///< prefix of the launcher's own messages
};

/// Start the ranks and supervise them until all are gone. Blocks; returns one
/// of the kExit* codes. Each rank gets DISTOPT_RANK, DISTOPT_WORLD_SIZE,
/// DISTOPT_LOCAL_RANK, DISTOPT_LOCAL_WORLD_SIZE, DISTOPT_RENDEZVOUS
/// (tcp://master_addr:port), DISTOPT_NODE_ID (node_rank), DISTOPT_JOB_TOKEN, DISTOPT_CONFIG (if
/// set), and, unless the launcher's environment sets it, OMP_NUM_THREADS = max(1, cores / nprocs)
/// so ranks do not oversubscribe the cores (torchrun does the same); elastic, also
/// DISTOPT_STORE_SERVED=1 and DISTOPT_ELASTIC=1 (and DISTOPT_RESTART_COUNT in a restarted rank);
/// otherwise those three are removed from the environment the ranks inherit, so
/// a launch inside an elastic job's rank still serves its own store. Every rank runs in its own
/// process group (so a rank's own children are stopped with it) with stdin from /dev/null, and dies
/// with the launcher (PR_SET_PDEATHSIG) if the launcher itself is killed. Each line a rank writes
/// to stdout / stderr is copied to the launcher's stdout / stderr prefixed with "[rank r] ". While
/// it runs, SIGINT / SIGTERM / SIGHUP are caught and forwarded to the ranks (a second one sends
/// SIGKILL); the previous handlers are restored before returning. Messages about the job ("rank 1
/// failed (exit code 3)") go to stderr prefixed with `name`. Throws
/// std::runtime_error if the job cannot be started (no pipes, bad options), and elastic
/// distopt::RendezvousError naming the address when the store cannot listen on
/// master_addr:port (e.g. the port is in use). Elastic, a store that cannot be reached
/// to record a dead rank is reported on stderr and the job goes on.
/// Not thread-safe: call from the main thread of a process that has one launcher.
int run(const LaunchOptions& opts);

/// 32 hex digits from std::random_device: the job token handed to every rank.
std::string random_token();

/// Split "HOST:PORT" (or "[V6]:PORT") of --rdzv-endpoint; throws
/// std::invalid_argument naming `what` when there is no valid port.
std::pair<std::string, int> split_endpoint(const std::string& endpoint, const std::string& what);

/// A TCP port that was free on 127.0.0.1 a moment ago (bound with port 0 and
/// released). Throws std::runtime_error if no socket can be bound.
int free_loopback_port();

/// Human-readable outcome of a waitpid() status: "exit code 3" or "killed by signal 9".
std::string describe_status(int wait_status);

}  // namespace distopt::launch
