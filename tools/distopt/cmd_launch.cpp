// `distopt launch [-n N] [--nnodes N --node-rank R --master-addr A --master-port P]
//  [--config JOB.yaml] [--timeout S] [--elastic [--max-restarts N]] -- PROGRAM ARGS...`
#include <boost/program_options.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/config.hpp"
#include "distopt/process.hpp"
#include "distopt/slurm.hpp"
#include "launch/job_rendezvous.hpp"
#include "launch/launcher.hpp"

namespace po = boost::program_options;

namespace distopt::cli {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name) {
  const char* v = env(name);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end || x < 0 || x > (1 << 24))
    throw std::invalid_argument(std::string(name) + "='" + v + "' is not a valid integer");
  return static_cast<int>(x);
}

constexpr const char* kHelp =
    "usage: distopt launch [-n N] [--config JOB.yaml] [--timeout S] -- PROGRAM ARGS...\n"
    "       distopt launch --elastic [--max-restarts N] [-n N] ... -- PROGRAM ARGS...\n"
    "       distopt launch --nnodes N --node-rank R --nproc-per-node K --master-addr HOST\n"
    "                      --master-port P [--rdzv-id ID] -- PROGRAM ARGS...   (on each node)\n"
    "       distopt launch --elastic --nnodes MIN:MAX -n K --master-addr HOST --master-port P\n"
    "                      [--rdzv-id ID] [--rdzv-settle S] -- PROGRAM ARGS... (on each node)\n"
    "\n"
    "Start the ranks of PROGRAM on this node (torchrun's options and numbering): local rank\n"
    "i of node R is global rank R*K + i of N*K. Each gets DISTOPT_RANK, DISTOPT_WORLD_SIZE,\n"
    "DISTOPT_LOCAL_RANK, DISTOPT_LOCAL_WORLD_SIZE, DISTOPT_RENDEZVOUS=tcp://HOST:P (rank 0,\n"
    "on node 0, serves it: HOST must be node 0's address), DISTOPT_JOB_TOKEN, DISTOPT_NODE_ID\n"
    "(nodeR, with --nnodes > 1 unless set), DISTOPT_CONFIG (with --config) and, unless set,\n"
    "OMP_NUM_THREADS = max(1, cores / K), and torchrun's RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR=HOST and MASTER_PORT (P + 1 with a fixed P, else\n"
    "another free port) for a PyTorch script's env:// rendezvous. The job file's world.rendezvous "
    "is replaced by this\n"
    "rendezvous (a line on stderr says so). One node: HOST is 127.0.0.1 and P a free port\n"
    "unless given. Inside a Slurm step with one task per node\n"
    "(srun --ntasks-per-node=1 distopt launch -n K -- ...), --nnodes and --node-rank come\n"
    "from SLURM_NTASKS and SLURM_PROCID, HOST from MASTER_ADDR or the first host of\n"
    "SLURM_JOB_NODELIST, P from MASTER_PORT or 29500 + SLURM_JOB_ID % 1000.\n"
    "Output lines are prefixed with \"[rank r] \" (global rank). If a rank fails, the others\n"
    "on this node are stopped and launch exits 1 (the other nodes' ranks fail at their next\n"
    "collective); Ctrl-C stops every local rank and exits 130; --timeout exits 124.\n"
    "--elastic: node 0's launcher serves the rendezvous store itself (it outlives rank 0);\n"
    "the ranks get DISTOPT_STORE_SERVED=1 and DISTOPT_ELASTIC=1. A rank that fails does not\n"
    "stop the others: the launcher sets store key elastic/dead/<member> to how it ended\n"
    "(\"exit code 3\"; the member id it gave the rank in DISTOPT_ELASTIC_MEMBER), adds 1 to\n"
    "elastic/dead_count, restarts it while --max-restarts allows\n"
    "(DISTOPT_RESTART_COUNT=k in its k-th restart) and waits for every rank. It exits 0 when\n"
    "a rank exited 0 and none failed at or after the last such exit (ranks seen ending in\n"
    "the same 50 ms poll end together), else 1.\n"
    "--elastic --nnodes MIN:MAX (torchrun's elastic nodes): the node launchers meet in the\n"
    "store at HOST:P, served by the first launcher that can bind it (with --node-rank, node\n"
    "0's). Once MIN have arrived it waits --rdzv-settle S (default 3) more seconds, or until\n"
    "MAX have, and the job starts with the N nodes present: N*K ranks, node ranks in arrival\n"
    "order unless --node-rank is given (then on every node, each below N). A launcher that\n"
    "arrives after the start starts its K ranks as --join does: the running ranks take\n"
    "them in at their next commit while the world stays within MAX*K ranks (or the job\n"
    "file's elastic.max_ranks); beyond it they wait world.timeout_s and fail. The store\n"
    "lives in its launcher: that launcher's end ends the job.\n\noptions";

// A command-line mistake: "distopt launch: WHAT" on stderr, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the command line, and Slurm, say about this node's part of the job.
struct NodeArgs {
  int nprocs = 0, nnodes = 1, node_rank = 0, port = 0;
  std::string nnodes_arg;            // --nnodes: N, or MIN:MAX (elastic nodes)
  int min_nodes = 0, max_nodes = 0;  // MIN:MAX, else 0
  std::string master_addr, endpoint;
  std::string token;  // --rdzv-id, else Slurm's, else $DISTOPT_JOB_TOKEN
};

// Index of the first "--" (argc when none): everything after it belongs to
// the program, untouched by option parsing.
int program_start(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) return i;
  return argc;
}

po::options_description launch_options(NodeArgs& n, launch::LaunchOptions& lo) {
  po::options_description desc(kHelp);
  desc.add_options()("help,h", "show this help")(
      "nproc-per-node,n", po::value<int>(&n.nprocs),
      "ranks on this node (default: world.size of --config / --nnodes)")(
      "nnodes", po::value<std::string>(&n.nnodes_arg),
      "nodes in the job (default 1); with --elastic, MIN:MAX: start with the nodes present "
      "once MIN have arrived, later ones join")("node-rank", po::value<int>(&n.node_rank),
                                                "this node's index, 0..nnodes-1 (default 0)")(
      "master-addr", po::value<std::string>(&n.master_addr),
      "address of node 0, where rank 0 serves the rendezvous (default 127.0.0.1)")(
      "master-port", po::value<int>(&n.port),
      "rendezvous port (required with --nnodes > 1; one node: a free one)")(
      "port", po::value<int>(), "the same as --master-port")(
      "rdzv-endpoint", po::value<std::string>(&n.endpoint),
      "HOST:PORT, the same as --master-addr HOST --master-port PORT")(
      "rdzv-id", po::value<std::string>(&n.token),
      "job token every node must give (default: $DISTOPT_JOB_TOKEN; else one node: random; "
      "several: derived from the rendezvous address)")("config", po::value<std::string>(&lo.config),
                                                       "job YAML, exported as DISTOPT_CONFIG")(
      "timeout", po::value<double>(&lo.timeout_s)->default_value(0),
      "stop the job after S seconds (0 = never)")(
      "failure-wait", po::value<double>(&lo.failure_wait_s)->default_value(4),
      "seconds the other ranks get to exit and report after one fails, before SIGTERM")(
      "grace", po::value<double>(&lo.grace_s)->default_value(5),
      "seconds between SIGTERM and SIGKILL")(
      "elastic", po::bool_switch(&lo.elastic),
      "a failed rank does not stop the others; the launcher serves the store")(
      "max-restarts", po::value<int>(&lo.max_restarts)->default_value(0),
      "with --elastic: restart failed ranks, at most N times in all on this node")(
      "rdzv-settle", po::value<double>(&lo.rdzv_settle_s)->default_value(3),
      "--nnodes MIN:MAX: seconds to wait for more nodes once MIN have arrived")(
      "rdzv-timeout", po::value<double>(&lo.rdzv_timeout_s)->default_value(600),
      "--nnodes MIN:MAX: give up when MIN nodes have not arrived within S seconds")(
      "join", po::bool_switch(&lo.join),
      "with --elastic: start ranks that join the running elastic job at --master-addr:"
      "--master-port (give its --rdzv-id); taken in at its next commit");
  return desc;
}

// --nnodes N, or MIN:MAX (elastic nodes: needs --elastic, not --join).
void parse_nnodes(const po::variables_map& vm, NodeArgs& n, const launch::LaunchOptions& lo) {
  if (!vm.count("nnodes")) return;
  const std::string& a = n.nnodes_arg;
  auto number = [&](const std::string& s) {
    char* end = nullptr;
    const long x = s.empty() ? -1 : std::strtol(s.c_str(), &end, 10);
    if (x < 1 || x > 4096 || *end)
      throw UsageError("--nnodes '" + a + "': give N or MIN:MAX, each between 1 and 4096");
    return static_cast<int>(x);
  };
  const size_t colon = a.find(':');
  if (colon == std::string::npos) {
    n.nnodes = number(a);
    return;
  }
  n.min_nodes = number(a.substr(0, colon));
  n.max_nodes = number(a.substr(colon + 1));
  if (n.min_nodes > n.max_nodes) throw UsageError("--nnodes " + a + ": MIN is above MAX");
  if (!lo.elastic || lo.join)
    throw UsageError("--nnodes " + a +
                     " (MIN:MAX) needs --elastic and no --join (a node that "
                     "arrives after the start joins by itself)");
  if (lo.rdzv_settle_s < 0 || lo.rdzv_timeout_s <= 0)
    throw UsageError("--rdzv-settle must not be negative, --rdzv-timeout must be positive");
  n.nnodes = n.max_nodes;  // node ranks, if given, are below MAX
}

// --port, --master-port and --rdzv-endpoint: one rendezvous address.
void resolve_endpoint(const po::variables_map& vm, NodeArgs& n) {
  if (vm.count("port")) {
    if (vm.count("master-port") && vm["port"].as<int>() != n.port)
      throw UsageError("--port and --master-port differ; give one");
    n.port = vm["port"].as<int>();
  }
  if (!vm.count("rdzv-endpoint")) return;
  if (vm.count("port")) throw UsageError("give --rdzv-endpoint or --port, not both");
  if (vm.count("master-addr") || vm.count("master-port"))
    throw UsageError("give --rdzv-endpoint or --master-addr/--master-port, not both");
  try {
    auto hp = launch::split_endpoint(n.endpoint, "--rdzv-endpoint");
    n.master_addr = hp.first;
    n.port = hp.second;
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// An sbatch script itself (Slurm's batch step: no SLURM_STEP_NUM_TASKS,
// which srun sets) runs once, on the allocation's first node: a launch there
// starts this node's ranks only, as a plain local launch, and is refused
// when the allocation has several nodes.
bool slurm_batch_step(const po::variables_map& vm) {
  const bool batch = env("SLURM_PROCID") && env("SLURM_NTASKS") && !env("SLURM_STEP_NUM_TASKS");
  if (!batch || vm.count("nnodes") || vm.count("node-rank")) return batch;
  const char* nodes_var = env("SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES"
                          : env("SLURM_NNODES")      ? "SLURM_NNODES"
                                                     : nullptr;
  if (nodes_var && env_int(nodes_var) > 1)
    throw UsageError(std::string("this is an sbatch script on the first of ") + env(nodes_var) +
                     " nodes, not an srun step: start one launcher per node with `srun "
                     "--ntasks-per-node=1 distopt launch ...` (or give --nnodes and "
                     "--node-rank)");
  return batch;
}

// Inside a Slurm step of one task per node, Slurm names the node, the
// rendezvous and the token (what the command line gives wins).
void apply_slurm_step(const po::variables_map& vm, NodeArgs& n) {
  const int tasks = env_int("SLURM_NTASKS");
  if (tasks <= 1) return;
  const char* nodes_var = env("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES"
                          : env("SLURM_NNODES")       ? "SLURM_NNODES"
                                                      : nullptr;
  if (nodes_var && env_int(nodes_var) != tasks)
    throw UsageError("SLURM_NTASKS=" + std::to_string(tasks) + " tasks on " + env(nodes_var) +
                     " nodes (" + nodes_var +
                     "): run one launcher per node (srun --ntasks-per-node=1 distopt "
                     "launch ...), or give --nnodes and --node-rank");
  n.nnodes = tasks;
  n.node_rank = env_int("SLURM_PROCID");
  const bool have_port = vm.count("master-port") || vm.count("port") || vm.count("rdzv-endpoint");
  const bool have_addr = vm.count("master-addr") || vm.count("rdzv-endpoint");
  // The Slurm rank environment describes the whole step; the rank's own
  // environment from this launcher wins (DISTOPT_* first).
  const ProcessInfo slurm = detect_process_info();
  if (!have_addr && !slurm.rendezvous.empty()) {
    const std::string hp = slurm.rendezvous.substr(6);  // tcp://
    const auto p = launch::split_endpoint(hp, "the Slurm rendezvous");
    n.master_addr = p.first;
    if (!have_port) n.port = p.second;
  } else if (!have_addr) {
    throw UsageError("Slurm step without SLURM_JOB_NODELIST or MASTER_ADDR: give --master-addr");
  } else if (!have_port) {
    n.port = env("MASTER_PORT") ? env_int("MASTER_PORT") : slurm_default_port();
  }
  if (n.token.empty()) n.token = slurm.token;
  std::cerr << "distopt launch: Slurm step: node " << n.node_rank << " of " << n.nnodes
            << " (SLURM_PROCID / SLURM_NTASKS)\n";
}

void check_nodes(const NodeArgs& n) {
  if (n.nnodes < 1 || n.nnodes > 4096)
    throw UsageError("--nnodes must be between 1 and 4096 (got " + std::to_string(n.nnodes) + ")");
  if (n.node_rank < 0 || n.node_rank >= n.nnodes)
    throw UsageError("--node-rank must be in 0.." + std::to_string(n.nnodes - 1) + " (got " +
                     std::to_string(n.node_rank) + ")");
  if ((n.nnodes > 1 || n.max_nodes > 0) && n.port == 0)
    throw UsageError("--nnodes " + (n.max_nodes > 0 ? n.nnodes_arg : std::to_string(n.nnodes)) +
                     " needs --master-port P (or --rdzv-endpoint HOST:P): every node must "
                     "name the same rendezvous");
}

// Ranks on this node: -n, else the job file's world.size / nnodes; refuses
// two different numbers. Notes the job file's rendezvous it replaces.
void resolve_ranks_per_node(const po::variables_map& vm, NodeArgs& n, launch::LaunchOptions& lo) {
  JobConfig job;
  const bool have_job = !lo.config.empty() && std::ifstream(lo.config).good();
  if (have_job) job = load_job_config(lo.config);
  const bool job_sets_size = have_job && job.world_size_set;
  if (n.max_nodes > 0 && !vm.count("nproc-per-node")) {
    throw UsageError("--nnodes " + n.nnodes_arg + ": give -n K (ranks per node)");
  } else if (lo.join && !vm.count("nproc-per-node")) {
    n.nprocs = 1;  // --join: one rank more, unless -n says how many
  } else if (!vm.count("nproc-per-node")) {
    if (lo.config.empty())
      throw UsageError("give -n N (ranks per node), or --config JOB.yaml to use its world.size");
    if (!have_job) job = load_job_config(lo.config);  // names the file it cannot read
    if (job.world_size % n.nnodes != 0)
      throw UsageError(lo.config + ": world.size " + std::to_string(job.world_size) +
                       " is not a multiple of --nnodes " + std::to_string(n.nnodes) + "; give -n");
    n.nprocs = static_cast<int>(job.world_size / n.nnodes);
  } else if (job_sets_size && !lo.join && n.max_nodes == 0 &&
             job.world_size != static_cast<int64_t>(n.nprocs) * n.nnodes) {
    // (--join: these ranks are added to a running job of world.size.)
    // Two numbers of ranks: refuse rather than guess which one was meant.
    // (A file this host cannot read is the program's business.)
    throw UsageError((n.nnodes > 1 ? std::to_string(n.nnodes) + " nodes x " : "") + "-n " +
                     std::to_string(n.nprocs) + " but " + lo.config + ":" +
                     std::to_string(job.world_size_mark.line + 1) + ": world.size is " +
                     std::to_string(job.world_size) + "; give the same number, or leave out -n");
  }
  if (n.nprocs < 1 || n.nprocs > 4096)
    throw UsageError("-n must be between 1 and 4096 (got " + std::to_string(n.nprocs) + ")");
  if (n.port < 0 || n.port > 65535)
    throw UsageError("--master-port must be in 0..65535 (got " + std::to_string(n.port) + ")");
  if (lo.timeout_s < 0 || lo.grace_s < 0 || lo.failure_wait_s < 0)
    throw UsageError("--timeout, --failure-wait and --grace must not be negative");
  if (lo.max_restarts < 0)
    throw UsageError("--max-restarts must not be negative (got " + std::to_string(lo.max_restarts) +
                     ")");
  if (lo.max_restarts > 0 && !lo.elastic)
    throw UsageError("--max-restarts " + std::to_string(lo.max_restarts) +
                     " needs --elastic (without it a failed rank stops the job)");
  if (lo.join && (!lo.elastic || n.port <= 0 || (n.token.empty() && !env("DISTOPT_JOB_TOKEN"))))
    throw UsageError(
        "--join needs --elastic, the running job's --master-port (or --rdzv-endpoint) and its "
        "token (--rdzv-id)");
  if (have_job) launch::note_job_rendezvous(job, lo);
}

// The launcher's options from the node's: several nodes share one token, the
// same on each without a word between them.
void fill_launch_options(NodeArgs n, launch::LaunchOptions& lo) {
  if (n.token.empty() && env("DISTOPT_JOB_TOKEN")) n.token = env("DISTOPT_JOB_TOKEN");
  lo.nprocs = n.nprocs;
  lo.nnodes = n.nnodes;
  lo.node_rank = n.node_rank;
  lo.min_nodes = n.min_nodes;
  lo.max_nodes = n.max_nodes;
  if (!n.master_addr.empty()) lo.master_addr = n.master_addr;
  lo.port = n.port;
  lo.token = !n.token.empty() || n.nnodes == 1
                 ? n.token
                 : "rdzv-" + lo.master_addr + ":" + std::to_string(n.port) + "-" +
                       (n.max_nodes > 0 ? n.nnodes_arg : std::to_string(n.nnodes)) + "x" +
                       std::to_string(n.nprocs);
}

int cmd_launch(int argc, char** argv) {
  const int split = program_start(argc, argv);
  launch::LaunchOptions lo;
  NodeArgs n;
  const po::options_description desc = launch_options(n, lo);
  po::options_description hidden;
  hidden.add_options()("program", po::value<std::vector<std::string>>(), "");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("program", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(split, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt launch: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("program")) lo.argv = vm["program"].as<std::vector<std::string>>();
  for (int i = split + 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
  if (lo.argv.empty()) {
    std::cerr << "distopt launch: no program given (put it after --)\n" << desc << "\n";
    return 2;
  }
  try {
    parse_nnodes(vm, n, lo);
    resolve_endpoint(vm, n);
    try {  // a malformed Slurm variable is a usage error naming it
      const bool batch = slurm_batch_step(vm);
      if (!vm.count("nnodes") && !vm.count("node-rank") && !batch && env("SLURM_PROCID") &&
          env("SLURM_NTASKS"))
        apply_slurm_step(vm, n);
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
    check_nodes(n);
    resolve_ranks_per_node(vm, n, lo);
  } catch (const UsageError& e) {
    std::cerr << "distopt launch: " << e.what() << "\n";
    return 2;
  }
  lo.node_rank_given = vm.count("node-rank") > 0;
  fill_launch_options(n, lo);
  std::cout.flush();
  return launch::run(lo);
}

}  // namespace

DISTOPT_REGISTER_COMMAND("launch",
                         "start a job's ranks on this node (-n K; --nnodes N --node-rank R "
                         "across machines; Slurm)",
                         cmd_launch);

}  // namespace distopt::cli
