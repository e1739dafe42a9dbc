// Intra-op threads per rank. One rule for `distopt train`, `distopt launch`
// and Runtime, so an embedding program gets what the CLI gets.
//
// Measured (tools/bench/scaling.py, BENCHMARKS.md "Threads and ranks"): with
// libtorch and OpenBLAS sharing one OpenMP runtime, splitting the cores
// evenly between the ranks of a host is the fastest setting; more threads
// than cores per host (oversubscription) is always slower.
#pragma once

namespace distopt {

/// Cores this process may run on (sched_getaffinity, so taskset, cgroup
/// cpusets and Slurm bindings count), at least 1. Thread-safe.
int available_cores();

/// The threads per rank distopt uses when nothing is set:
/// max(1, available_cores() / local_world_size). Thread-safe.
int default_threads_per_rank(int local_world_size);

/// The threads per rank the user asked for: `configured` if > 0, else
/// $OMP_NUM_THREADS if set to a positive integer, else 0 (nothing asked).
/// Thread-safe.
int requested_threads_per_rank(int configured);

/// requested_threads_per_rank(configured) if > 0, else
/// default_threads_per_rank(local_world_size). Thread-safe.
int choose_threads_per_rank(int configured, int local_world_size);

/// Sizes libtorch's intra-op pool (at::set_num_threads, which also sets
/// OpenMP's and so the OpenMP OpenBLAS's) and OpenBLAS's own pool when the
/// BLAS is the pthread build. Call from the training thread before work
/// starts; n >= 1.
void set_threads_per_rank(int n);

}  // namespace distopt
