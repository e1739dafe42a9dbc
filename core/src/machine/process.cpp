// Rank / world-size detection from the launcher's environment, and the Slurm
// helpers it needs (host-list expansion, tasks per node, default port).
#include "distopt/process.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "distopt/error.hpp"
#include "distopt/slurm.hpp"

namespace distopt {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int parse_int(const char* name, const char* text, int lo) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > (1 << 24))
    throw ConfigError(std::string("environment variable ") + name + "='" + text +
                      "' is not a valid integer >= " + std::to_string(lo));
  return static_cast<int>(v);
}

struct Scheme {
  const char* source;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;
};

// Precedence: our own launcher first, then torchrun, Slurm, Open MPI.
constexpr Scheme kSchemes[] = {
    {"distopt", "DISTOPT_RANK", "DISTOPT_WORLD_SIZE", "DISTOPT_LOCAL_RANK",
     "DISTOPT_LOCAL_WORLD_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

// The hosts of one list item ("node[01-03]x[1,2]"): the cartesian product of
// its bracket groups, left to right.
std::vector<std::string> expand_item(const std::string& item, const std::string& what) {
  auto bad = [&](const std::string& why) { return ConfigError(what + "='" + item + "': " + why); };
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) throw bad("']' without '['");
    return {item};
  }
  const size_t close = item.find(']', open);
  if (close == std::string::npos) throw bad("'[' without ']'");
  const std::string prefix = item.substr(0, open);
  const std::string body = item.substr(open + 1, close - open - 1);
  const std::vector<std::string> rest = expand_item(item.substr(close + 1), what);
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    const std::string range = body.substr(pos, comma - pos);
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      if (s.empty() || s.size() > 9) return false;
      for (char c : s)
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      return true;
    };
    if (!digits(lo) || !digits(hi)) throw bad("'" + range + "' is not N or N-M");
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a) throw bad("range '" + range + "' runs backwards");
    if (b - a > 100000) throw bad("range '" + range + "' is too large");
    for (long v = a; v <= b; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');  // keep padding
      for (const auto& r : rest) out.push_back(prefix + num + r);
    }
    pos = comma + 1;
  }
  return out;
}

// Under Slurm: the master is the first host of the step's (else the job's)
// node list, where srun starts task 0.
std::string slurm_master_host() {
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (const char* list = env(var)) {
      auto hosts = expand_slurm_nodelist(list, var);
      if (!hosts.empty()) return hosts.front();
    }
  return "";
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::string item;
  auto flush = [&] {
    if (!item.empty())
      for (auto& h : expand_item(item, what)) hosts.push_back(std::move(h));
    item.clear();
  };
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw ConfigError(what + "='" + list + "': ']' without '['");
    if (c == ',' && depth == 0) {
      flush();
      continue;
    }
    if (!std::isspace(static_cast<unsigned char>(c))) item += c;
  }
  if (depth != 0) throw ConfigError(what + "='" + list + "': '[' without ']'");
  flush();
  return hosts;
}

int slurm_default_port() {
  const char* id = env("SLURM_JOB_ID");
  if (!id) id = env("SLURM_JOBID");
  return 29500 + (id ? parse_int("SLURM_JOB_ID", id, 0) % 1000 : 0);
}

int slurm_tasks_on_node(const std::string& list, int node, const std::string& what) {
  // Items "N" or "N(xK)", comma-separated, one per run of nodes.
  int first = 0;  // index of the first node the current item covers
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string itm = list.substr(pos, comma - pos);
    int count = 0, repeat = 1, used = 0;
    const bool ok = (std::sscanf(itm.c_str(), "%d(x%d)%n", &count, &repeat, &used) == 2 ||
                     (repeat = 1, std::sscanf(itm.c_str(), "%d%n", &count, &used) == 1)) &&
                    used == static_cast<int>(itm.size()) && count >= 1 && repeat >= 1;
    if (!ok) throw ConfigError(what + "='" + list + "': '" + itm + "' is not N or N(xK)");
    if (node < first + repeat) return count;
    first += repeat;
    pos = comma + 1;
  }
  throw ConfigError(what + "='" + list + "' has no entry for node " + std::to_string(node));
}

// Inside an sbatch script (the batch step) Slurm sets SLURM_PROCID=0 and
// the allocation's SLURM_NTASKS, but only this one process runs: rank 0
// would wait out the rendezvous timeout for ranks nobody starts. srun sets
// SLURM_STEP_NUM_TASKS for every task of the step it starts (and
// SLURM_NTASKS to the same count unless --preserve-env keeps the
// allocation's), so a process without it, or with another count, is not
// one of SLURM_NTASKS tasks.
void refuse_slurm_batch_step(int64_t ntasks) {
  const char* step_tasks = env("SLURM_STEP_NUM_TASKS");
  if (step_tasks && parse_int("SLURM_STEP_NUM_TASKS", step_tasks, 1) == ntasks) return;
  throw ConfigError(
      "SLURM_NTASKS=" + std::to_string(ntasks) + " but this process is not one of " +
      std::to_string(ntasks) + " srun tasks (SLURM_STEP_NUM_TASKS " +
      (step_tasks ? std::string("is ") + step_tasks : std::string("is not set")) +
      "; an sbatch script itself runs once): start the ranks with `srun distopt train JOB.yaml`, "
      "or one `distopt launch` per node with `srun --ntasks-per-node=1 distopt launch "
      "--nproc-per-node N ...`");
}

ProcessInfo detect_process_info() {
  ProcessInfo info;
  info.source = "default";
  for (const auto& s : kSchemes) {
    const char* r = env(s.rank);
    const char* w = env(s.world);
    if (!r || !w) continue;
    info.source = s.source;
    info.rank = parse_int(s.rank, r, 0);
    info.world_size = parse_int(s.world, w, 1);
    if (info.rank >= info.world_size)
      throw ConfigError(std::string(s.rank) + "=" + r + " is not below " + s.world + "=" + w);
    const char* lr = env(s.local_rank);
    info.local_rank = lr ? parse_int(s.local_rank, lr, 0) : info.rank;
    const char* lw = env(s.local_world);
    // Slurm's NTASKS_PER_NODE may read "2(x3)": take the leading count.
    if (lw) {
      std::string t(lw);
      t = t.substr(0, t.find('('));
      info.local_world_size = parse_int(s.local_world, t.c_str(), 1);
    } else if (info.source == std::string("slurm") && env("SLURM_TASKS_PER_NODE")) {
      const char* node = env("SLURM_NODEID");
      info.local_world_size = slurm_tasks_on_node(env("SLURM_TASKS_PER_NODE"),
                                                  node ? parse_int("SLURM_NODEID", node, 0) : 0);
    } else {
      info.local_world_size = info.world_size;
    }
    break;
  }
  const bool slurm = info.source == "slurm";
  if (slurm && info.world_size > 1) refuse_slurm_batch_step(info.world_size);
  if (const char* rv = env("DISTOPT_RENDEZVOUS")) {
    info.rendezvous = rv;
  } else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
    info.rendezvous = std::string("tcp://") + env("MASTER_ADDR") + ":" + env("MASTER_PORT");
  } else if (slurm) {
    const std::string host = env("MASTER_ADDR") ? env("MASTER_ADDR") : slurm_master_host();
    const int port =
        env("MASTER_PORT") ? parse_int("MASTER_PORT", env("MASTER_PORT"), 1) : slurm_default_port();
    if (!host.empty()) info.rendezvous = "tcp://" + host + ":" + std::to_string(port);
  }
  if (const char* t = env("DISTOPT_JOB_TOKEN")) {
    info.token = t;
  } else if (slurm && (env("SLURM_JOB_ID") || env("SLURM_JOBID"))) {
    // Every task of one step shares it; another job's tasks are refused.
    const char* step = env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : env("SLURM_STEPID");
    info.token = std::string("slurm-") +
                 (env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : env("SLURM_JOBID")) + "." +
                 (step ? step : "0");
  }
  return info;
}

namespace {

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" ||
         host == "[::1]";
}

/// The host part of a rendezvous URL ("" when it has none, e.g. file://).
std::string rendezvous_host(const std::string& url) {
  if (url.rfind("tcp://", 0) == 0) {
    std::string hp = url.substr(6);
    if (!hp.empty() && hp[0] == '[') return hp.substr(1, hp.find(']') - 1);
    return hp.substr(0, hp.rfind(':'));
  }
  if (url.rfind("env://", 0) == 0) {
    const char* a = std::getenv("MASTER_ADDR");
    return a ? a : "";
  }
  return "";
}

/// The local address of the interface that routes to `host` (a UDP
/// connect() sends nothing; getsockname() then names the interface).
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res)
    throw RendezvousError("cannot resolve rendezvous host '" + host + "'");
  std::string out;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char buf[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf))
      out = buf;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (out.empty())
    throw RendezvousError("no local interface routes to rendezvous host '" + host + "'");
  return out;
}

}  // namespace

std::string choose_bind_address(const std::string& rendezvous) {
  if (const char* b = std::getenv("DISTOPT_BIND_ADDRESS"); b && *b) return b;
  std::string host = rendezvous_host(rendezvous);
  if (is_loopback(host)) return "127.0.0.1";
  return local_address_towards(host);
}

}  // namespace distopt
