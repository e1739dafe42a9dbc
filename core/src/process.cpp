// Rank / world-size detection from the launcher's environment.
#include "distopt/process.hpp"

#include <cstdlib>
#include <string>

#include "distopt/error.hpp"

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

}  // namespace

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
    } else {
      info.local_world_size = info.world_size;
    }
    break;
  }
  if (const char* rv = env("DISTOPT_RENDEZVOUS")) {
    info.rendezvous = rv;
  } else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
    info.rendezvous = std::string("tcp://") + env("MASTER_ADDR") + ":" + env("MASTER_PORT");
  }
  if (const char* t = env("DISTOPT_JOB_TOKEN")) info.token = t;
  return info;
}

}  // namespace distopt
