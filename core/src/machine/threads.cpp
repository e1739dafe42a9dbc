// Intra-op thread sizing (see threads.hpp).
#include "distopt/threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace distopt {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int default_threads_per_rank(int local_world_size) {
  return std::max(1, available_cores() / std::max(1, local_world_size));
}

int requested_threads_per_rank(int configured) {
  if (configured > 0) return configured;
  if (const char* a = std::getenv("DISTOPT_THREADS_AUTO"); a && std::strcmp(a, "1") == 0) return 0;
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n > 0 && n < 1 << 16) ? static_cast<int>(n) : 0;
}

int choose_threads_per_rank(int configured, int local_world_size) {
  const int asked = requested_threads_per_rank(configured);
  return asked > 0 ? asked : default_threads_per_rank(local_world_size);
}

std::string core_set_id() {
  std::string id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, id);
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string mask;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    // The mask as a string of CPU numbers: "0,1,2,3".
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) mask += (mask.empty() ? "" : ",") + std::to_string(c);
  }
  return id + "|" + mask;
}

int threads_for_ranks_sharing_cores(int ranks) { return default_threads_per_rank(ranks); }

void set_threads_per_rank(int n) {
  n = std::max(1, n);
  at::set_num_threads(n);
  // Kept for the pthread OpenBLAS build only: its pool is not OpenMP's, so
  // at::set_num_threads does not size it, and ranks x its default (all
  // cores) would oversubscribe the host. The OpenMP build follows
  // omp_set_num_threads by itself; the call is then a no-op in effect.
  using SetBlasThreads = void (*)(int);
  if (auto set_blas =
          reinterpret_cast<SetBlasThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas(n);
}

}  // namespace distopt
