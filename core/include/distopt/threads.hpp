// Intra-op threads per rank. One rule for `distopt train`, `distopt launch`
// and Runtime, so an embedding program gets what the CLI gets.
//
// Measured (tools/bench/scaling.py, BENCHMARKS.md "Threads and ranks"): with
// libtorch and OpenBLAS sharing one OpenMP runtime, splitting the cores
// evenly between the ranks of a host is the fastest setting; more threads
// than cores per host (oversubscription) is always slower.
#pragma once

#include <string>

namespace distopt {

/// Cores this process may run on (sched_getaffinity, so taskset, cgroup
/// cpusets and Slurm bindings count), at least 1. Thread-safe.
int available_cores();

/// The threads per rank distopt uses when nothing is set:
/// max(1, available_cores() / local_world_size). Thread-safe.
int default_threads_per_rank(int local_world_size);

/// The threads per rank the user asked for: `configured` if > 0, else
/// $OMP_NUM_THREADS if set to a positive integer by the user, else 0
/// (nothing asked). An OMP_NUM_THREADS that `distopt launch` chose itself
/// (it then sets DISTOPT_THREADS_AUTO=1 beside it) is not a request: it
/// counts only the launcher's own ranks. Thread-safe.
int requested_threads_per_rank(int configured);

/// Identifies the cores this process runs on: the kernel's boot id and the
/// process's CPU affinity mask. Ranks with equal ids share the same cores,
/// whoever started them (two launchers on one host, a joining rank), so
/// they split them (threads_for_ranks_sharing_cores). Never throws.
std::string core_set_id();

/// max(1, available_cores() / ranks), the threads per rank when `ranks`
/// processes share this process's cores (ranks >= 1). Thread-safe.
int threads_for_ranks_sharing_cores(int ranks);

/// requested_threads_per_rank(configured) if > 0, else
/// default_threads_per_rank(local_world_size). Thread-safe.
int choose_threads_per_rank(int configured, int local_world_size);

/// Sizes libtorch's intra-op pool (at::set_num_threads, which also sets
/// OpenMP's and so the OpenMP OpenBLAS's) and OpenBLAS's own pool when the
/// BLAS is the pthread build. Call from the training thread before work
/// starts; n >= 1.
void set_threads_per_rank(int n);

}  // namespace distopt
