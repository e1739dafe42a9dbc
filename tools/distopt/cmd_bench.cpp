// `distopt bench <what>`: benchmarks. `bench comm` measures a communicator's
// collective bandwidth on N local ranks (algbw and busbw as nccl-tests define
// them). Other benchmarks (`bench step`) register in kBenches below.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "command.hpp"
#include "distopt/component_options.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/process.hpp"
#include "distopt/registry.hpp"
#include "distopt/store.hpp"

namespace po = boost::program_options;

// bench_step.cpp: `distopt bench step` (inner-optimizer step, unfused vs fused).
int distopt_bench_step(int argc, char** argv);
// bench_shard.cpp: `distopt bench shard` (memory and speed of allreduce, zero 1-3).
int distopt_bench_shard(int argc, char** argv);

namespace {

// "4096", "4K", "64M", "1G" -> bytes.
size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  size_t mul = 1;
  if (unit == "K" || unit == "k" || unit == "KiB")
    mul = 1 << 10;
  else if (unit == "M" || unit == "m" || unit == "MiB")
    mul = 1 << 20;
  else if (unit == "G" || unit == "g" || unit == "GiB")
    mul = 1 << 30;
  else if (!unit.empty())
    throw distopt::Error("bad size '" + s + "' (use e.g. 4096, 4K, 64M)");
  if (v <= 0) throw distopt::Error("size '" + s + "' must be positive");
  return static_cast<size_t>(v * static_cast<double>(mul));
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    throw distopt::Error("bench: cannot find a free port on 127.0.0.1");
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct CommBenchArgs {
  std::string communicator = "tcp", op = "allreduce", options = "{}", json;
  std::string where = "loopback";  ///< for the table's title
  int nranks = 2, iters = 0, warmup = 2;
  size_t min_bytes = 4096, max_bytes = 64u << 20;
  std::vector<std::string> plugin_paths;
};

struct Row {
  size_t bytes, count;
  double time_us;                   ///< median over the iterations (slowest rank each)
  double time_min_us, time_max_us;  ///< fastest and slowest iteration
  double algbw, busbw;              ///< from the median
};

double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast and the point-to-point ops: bytes per rank and direction
}

// The point-to-point ops, which tell a link's one-way rate from its
// full-duplex use: `send`: ranks 2k -> 2k+1 only (one direction); `exchange`:
// 2k <-> 2k+1 send to each other at once; `shift`: every rank sends to
// rank+1 and receives from rank-1 at once (a decentralized ring's half).
// A full-duplex link gives `exchange` the time of `send`.
bool point_to_point(const std::string& op) {
  return op == "send" || op == "exchange" || op == "shift";
}

// One rank's part: connect, then time the operation at every size. Rank 0
// returns the rows (others return an empty vector).
// One rank's place in the job: the store's URL, the address its listeners
// bind, and the job token.
struct RankSite {
  std::string url, bind, token;
};

std::vector<Row> bench_rank(const CommBenchArgs& a, int rank, const RankSite& site) {
  using namespace distopt;
  PluginRegistry registry;
  std::vector<std::string> dirs = PluginRegistry::search_path(a.plugin_paths);
  registry.discover(dirs);
  const ComponentInfo& info = registry.get(DOPT_KIND_COMMUNICATOR, a.communicator);
  StoreOptions so;
  so.url = site.url;
  so.rank = rank;
  so.world_size = a.nranks;
  so.token = site.token;
  auto store = make_store(so);
  Options opts =
      Options::validate(YAML::Load(a.options), info.options, "--options", "communicator.options");
  dopt_create_args ca{};
  ca.struct_size = sizeof ca;
  ca.rank = rank;
  ca.world_size = a.nranks;
  ca.local_rank = rank;
  ca.local_world_size = a.nranks;
  ca.options = opts.c_handle();
  ca.store = reinterpret_cast<dopt_store*>(store.get());
  ca.scope = "bench";
  ca.job_token = site.token.c_str();
  ca.bind_address = site.bind.c_str();
  std::vector<Row> rows;
  {
    Communicator comm(info, ca);
    const int n = a.nranks;
    const DLDataType f32{kDLFloat, 32, 1};
    // Buffers: allgather's recv and reduce_scatter's send are the full size.
    std::vector<float> send(a.max_bytes / 4 + n, 1.0f), recv(a.max_bytes / 4 + n, 0.0f);
    for (size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 2) {
      size_t count = bytes / 4;
      if (!point_to_point(a.op)) count -= count % static_cast<size_t>(n);  // block ops: n | count
      if (count == 0) continue;
      int64_t s1, s2;
      DLTensor ts, tr;
      // Point-to-point ops post their send and receive, then wait for both.
      auto p2p = [&]() {
        ts = make_dltensor(send.data(), static_cast<int64_t>(count), f32, &s1);
        tr = make_dltensor(recv.data(), static_cast<int64_t>(count), f32, &s2);
        const int partner = rank ^ 1, right = (rank + 1) % n, left = (rank + n - 1) % n;
        std::vector<CommRequest> reqs;
        if (a.op == "shift") {
          reqs.push_back(comm.send(ts, right, 0));
          reqs.push_back(comm.recv(tr, left, 0));
        } else if (partner < n) {  // an odd world's last rank idles
          if (a.op == "exchange" || rank % 2 == 0) reqs.push_back(comm.send(ts, partner, 0));
          if (a.op == "exchange" || rank % 2 == 1) reqs.push_back(comm.recv(tr, partner, 0));
        }
        for (auto& r : reqs) r.wait();
        return reqs.size() == 2 || (a.op == "send" && rank % 2 == 1 && partner < n);  // received
      };
      auto issue = [&]() {
        if (a.op == "allreduce") {
          ts = make_dltensor(send.data(), static_cast<int64_t>(count), f32, &s1);
          tr = make_dltensor(recv.data(), static_cast<int64_t>(count), f32, &s2);
          return comm.allreduce(ts, tr, DOPT_REDUCE_SUM);
        }
        if (a.op == "reduce_scatter") {
          ts = make_dltensor(send.data(), static_cast<int64_t>(count), f32, &s1);
          tr = make_dltensor(recv.data(), static_cast<int64_t>(count / n), f32, &s2);
          return comm.reduce_scatter(ts, tr, DOPT_REDUCE_SUM);
        }
        if (a.op == "allgather") {
          ts = make_dltensor(send.data(), static_cast<int64_t>(count / n), f32, &s1);
          tr = make_dltensor(recv.data(), static_cast<int64_t>(count), f32, &s2);
          return comm.allgather(ts, tr);
        }
        tr = make_dltensor(recv.data(), static_cast<int64_t>(count), f32, &s2);
        return comm.broadcast(tr, 0);
      };
      int iters = a.iters > 0 ? a.iters
                              : static_cast<int>(std::clamp<size_t>((512u << 20) / bytes, 5, 200));
      // The first size also pays for connection and page warm-up: more
      // untimed iterations there, so that it is not an outlier.
      const int warmup = bytes == a.min_bytes ? std::max(a.warmup, 20) : a.warmup;
      auto once = [&]() {
        if (point_to_point(a.op))
          p2p();
        else
          issue().wait();
      };
      for (int i = 0; i < warmup; ++i) once();
      comm.barrier().wait();
      // A point-to-point op delivered the sender's ones (recv starts as zeros).
      if (point_to_point(a.op)) {
        std::fill(recv.begin(), recv.begin() + static_cast<std::ptrdiff_t>(count), 0.0f);
        if (p2p() && std::count(recv.begin(), recv.begin() + static_cast<std::ptrdiff_t>(count),
                                1.0f) != static_cast<std::ptrdiff_t>(count))
          throw distopt::Error("rank " + std::to_string(rank) + ": --op " + a.op + " of " +
                               std::to_string(count * 4) + " bytes delivered wrong data");
      }
      // Each iteration timed on its own; the slowest rank's time per
      // iteration (what a job would see) by one MAX allreduce of all of them.
      std::vector<double> secs(static_cast<size_t>(iters));
      for (int i = 0; i < iters; ++i) {
        // Point-to-point iterations start together: a send completes once
        // it is in the socket, so unsynchronized ranks would run ahead and
        // time each other's backlog instead of one exchange.
        if (point_to_point(a.op)) comm.barrier().wait();
        auto t0 = std::chrono::steady_clock::now();
        once();
        secs[static_cast<size_t>(i)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      int64_t shape;
      DLTensor tt = make_dltensor(secs.data(), iters, DLDataType{kDLFloat, 64, 1}, &shape);
      comm.allreduce(tt, tt, DOPT_REDUCE_MAX).wait();
      std::sort(secs.begin(), secs.end());
      const double median = secs.size() % 2
                                ? secs[secs.size() / 2]
                                : 0.5 * (secs[secs.size() / 2 - 1] + secs[secs.size() / 2]);
      size_t b = count * 4;
      double algbw = static_cast<double>(b) / median / 1e9;
      rows.push_back(Row{b, count, median * 1e6, secs.front() * 1e6, secs.back() * 1e6, algbw,
                         algbw * bus_factor(a.op, n)});
    }
    comm.barrier().wait();
  }
  // Rank 0 hosts the store: keep it up until the others are done with it.
  if (rank != 0)
    store->set("bench/left/" + std::to_string(rank), std::string("1"));
  else
    for (int p = 1; p < a.nranks; ++p)
      store->get("bench/left/" + std::to_string(p), std::chrono::seconds(60));
  return rank == 0 ? rows : std::vector<Row>{};
}

void print_rows(const CommBenchArgs& a, const std::vector<Row>& rows) {
  std::printf("# distopt bench comm: %s %s, %d ranks, float32 sum, %s\n", a.communicator.c_str(),
              a.op.c_str(), a.nranks, a.where.c_str());
  std::printf(
      "# time: median over the iterations of the slowest rank's time; min..max beside it\n");
  std::printf("# %12s %12s %12s %21s %12s %12s\n", "size(B)", "count", "time(us)", "min..max(us)",
              "algbw(GB/s)", "busbw(GB/s)");
  for (const auto& r : rows) {
    char range[64];
    std::snprintf(range, sizeof range, "%.1f..%.1f", r.time_min_us, r.time_max_us);
    std::printf("  %12zu %12zu %12.1f %21s %12.3f %12.3f\n", r.bytes, r.count, r.time_us, range,
                r.algbw, r.busbw);
  }
  std::fflush(stdout);
  if (!a.json.empty()) {
    nlohmann::json j;
    j["communicator"] = a.communicator;
    j["op"] = a.op;
    j["nranks"] = a.nranks;
    j["rows"] = nlohmann::json::array();
    for (const auto& r : rows)
      j["rows"].push_back({{"bytes", r.bytes},
                           {"count", r.count},
                           {"time_us", r.time_us},
                           {"time_min_us", r.time_min_us},
                           {"time_max_us", r.time_max_us},
                           {"algbw_gbs", r.algbw},
                           {"busbw_gbs", r.busbw}});
    std::ofstream out(a.json);
    out << j.dump(2) << "\n";
    if (!out) throw distopt::Error("bench: cannot write " + a.json);
  }
}

// Under a launcher: this process is one rank of the launcher's world.
int bench_launched_rank(CommBenchArgs a, const distopt::ProcessInfo& proc) {
  if (proc.rendezvous.empty())
    throw distopt::Error(
        "bench comm: started as rank " + std::to_string(proc.rank) + " by " + proc.source +
        " but no rendezvous address (DISTOPT_RENDEZVOUS or MASTER_ADDR/MASTER_PORT)");
  a.nranks = proc.world_size;
  a.where = "rendezvous " + proc.rendezvous;
  const char* bind = std::getenv("DISTOPT_BIND_ADDRESS");
  const RankSite site{proc.rendezvous, bind && *bind ? bind : "127.0.0.1", proc.token};
  auto rows = bench_rank(a, proc.rank, site);
  if (proc.rank == 0) print_rows(a, rows);
  return 0;
}

int bench_comm(int argc, char** argv) {
  CommBenchArgs a;
  std::string min_s = "4K", max_s = "64M";
  po::options_description opts(
      "usage: distopt bench comm [--communicator tcp] [-n 2] [--min-bytes 4K] [--max-bytes 64M]\n"
      "                          [--iters N] [--op allreduce] [--plugin-path DIR] [--json FILE]\n\n"
      "Start N local ranks, connect them through a tcp:// store on 127.0.0.1, and time\n"
      "the operation for sizes doubling from min to max bytes (float32). Rank 0 prints\n"
      "size, count, time, algbw = bytes/time and busbw = algbw * factor (nccl-tests:\n"
      "2(n-1)/n for allreduce, (n-1)/n for reduce_scatter/allgather, 1 for broadcast).\n"
      "Under a launcher (DISTOPT_RANK/DISTOPT_WORLD_SIZE, torchrun, Slurm, Open MPI) it\n"
      "runs as that one rank instead (-n is the launcher's world size), rendezvous at\n"
      "DISTOPT_RENDEZVOUS (or MASTER_ADDR/MASTER_PORT) with DISTOPT_JOB_TOKEN, its\n"
      "listeners bound to DISTOPT_BIND_ADDRESS (default 127.0.0.1): one rank per host.\n\noptions");
  opts.add_options()("help,h", "show this help")("communicator,c", po::value(&a.communicator),
                                                 "component name (tcp)")(
      "nranks,n", po::value(&a.nranks), "number of local ranks (2)")(
      "min-bytes", po::value(&min_s), "smallest size (4K)")("max-bytes", po::value(&max_s),
                                                            "largest size (64M)")(
      "iters", po::value(&a.iters), "timed iterations per size (default: by size, 5..200)")(
      "warmup", po::value(&a.warmup), "untimed iterations per size (2)")(
      "op", po::value(&a.op),
      "allreduce | reduce_scatter | allgather | broadcast, or point-to-point: send (ranks "
      "2k -> 2k+1), exchange (2k <-> 2k+1 at once), shift (rank -> rank+1 and rank-1 -> rank "
      "at once)")("options", po::value(&a.options),
                  "communicator options as a YAML map, e.g. '{chunk_bytes: 131072}'")(
      "plugin-path,P", po::value(&a.plugin_paths)->composing(),
      "also search DIR for plugins (repeatable)")("json", po::value(&a.json),
                                                  "also write the table as JSON to FILE");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt bench comm: " << e.what() << "\n\n" << opts << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  if (a.nranks < 1 || a.nranks > 64) throw distopt::Error("bench comm: -n must be in 1..64");
  if (a.op != "allreduce" && a.op != "reduce_scatter" && a.op != "allgather" &&
      a.op != "broadcast" && !point_to_point(a.op))
    throw distopt::Error(
        "bench comm: unknown --op '" + a.op +
        "' (valid: allreduce, reduce_scatter, allgather, broadcast, send, exchange, shift)");
  if (point_to_point(a.op) && a.nranks < 2)
    throw distopt::Error("bench comm: --op " + a.op + " needs -n 2 or more");
  a.min_bytes = parse_size(min_s);
  a.max_bytes = parse_size(max_s);
  if (a.min_bytes > a.max_bytes)
    throw distopt::Error("bench comm: --min-bytes is above --max-bytes");

  const distopt::ProcessInfo proc = distopt::detect_process_info();
  if (proc.source != "default") return bench_launched_rank(a, proc);

  std::random_device rd;
  const std::string token = std::to_string(rd()) + std::to_string(rd());
  std::fflush(stdout);
  const RankSite site{"tcp://127.0.0.1:" + std::to_string(free_port()), "127.0.0.1", token};
  std::vector<pid_t> pids;
  for (int r = 0; r < a.nranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) throw distopt::Error("bench comm: fork failed");
    if (pid == 0) {
      int rc = 0;
      try {
        auto rows = bench_rank(a, r, site);
        if (r == 0) print_rows(a, rows);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "distopt bench comm: rank %d: %s\n", r, e.what());
        rc = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  // Wait; the first failure stops the rest.
  int status = 0, left = a.nranks;
  while (left > 0) {
    int st = 0;
    pid_t w = wait(&st);
    if (w < 0) break;
    --left;
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok && status == 0) {
      status = 1;
      for (pid_t p : pids)
        if (p != w) kill(p, SIGTERM);
    }
  }
  return status;
}

struct Bench {
  const char* name;
  const char* summary;
  int (*run)(int, char**);
};
// `bench step` (optimizer-step throughput) is added here by its owner.
const Bench kBenches[] = {
    {"comm", "communicator bandwidth: time, algbw, busbw per size", bench_comm},
    {"step", "optimizer step: unfused libtorch vs fused, time and GB/s vs copy bandwidth",
     distopt_bench_step},
    {"shard", "per-rank peak memory and samples/s of allreduce and zero stages 1-3 at 1-4 ranks",
     distopt_bench_shard},
};

int run_bench(int argc, char** argv) {
  auto usage = [](std::ostream& os) {
    os << "usage: distopt bench <what> [options]\n\nbenchmarks:\n";
    for (const auto& b : kBenches) os << "  " << b.name << "  " << b.summary << "\n";
    os << "\n`distopt bench <what> --help` shows its options.\n";
  };
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& b : kBenches)
    if (!std::strcmp(argv[1], b.name)) {
      std::string prog = std::string("distopt bench ") + b.name;
      argv[1] = prog.data();
      return b.run(argc - 1, argv + 1);
    }
  std::cerr << "distopt bench: unknown benchmark '" << argv[1] << "'\n";
  usage(std::cerr);
  return 2;
}

}  // namespace

DISTOPT_REGISTER_COMMAND("bench",
                         "benchmarks: `bench comm` (collective bandwidth), `bench step` "
                         "(optimizer step)",
                         run_bench);
