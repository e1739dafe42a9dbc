// Which rank this process is, read from the launcher's environment, and the
// address its communicators listen on.
#pragma once

#include <string>

namespace distopt {

struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  /// DISTOPT_RENDEZVOUS, else tcp://MASTER_ADDR:MASTER_PORT, else under
  /// Slurm the first node's (slurm.hpp); "" if none applies
  std::string rendezvous;
  std::string token;   ///< DISTOPT_JOB_TOKEN, else under Slurm "slurm-JOBID.STEPID", else ""
  std::string source;  ///< "distopt", "torchrun", "slurm", "openmpi" or "default"
};

/// Read, in this order of precedence: DISTOPT_RANK/WORLD_SIZE/LOCAL_RANK/
/// LOCAL_WORLD_SIZE (set by `distopt launch`), torchrun's RANK/WORLD_SIZE/
/// LOCAL_RANK/LOCAL_WORLD_SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID,
/// Open MPI's OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; none set means
/// a single process (rank 0 of 1). Slurm's local world size, master host,
/// port and token: distopt/slurm.hpp. Throws ConfigError for a malformed or
/// out-of-range value, naming the variable.
ProcessInfo detect_process_info();

/// The local address this rank's communicators listen on, for a job whose
/// rendezvous is `rendezvous_url` (tcp://HOST:PORT, env:// with MASTER_ADDR,
/// or one without a host): $DISTOPT_BIND_ADDRESS if set, else 127.0.0.1 for
/// a loopback or absent host, else the address of the interface that routes
/// to HOST. Throws RendezvousError when HOST does not resolve or no
/// interface routes to it.
std::string choose_bind_address(const std::string& rendezvous_url);

}  // namespace distopt
