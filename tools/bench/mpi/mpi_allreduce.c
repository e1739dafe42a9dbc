/* The Open MPI anchor for `distopt bench comm` (issue 23): MPI_Allreduce of
 * float32 SUM for sizes doubling from --min-bytes to --max-bytes, timed the
 * way distopt's bench times its communicators, so the two tables compare
 * row by row:
 *   - untimed warm-up iterations per size (20 at the first size, which also
 *     pays for connection and page warm-up; --warmup, default 2, after);
 *   - each timed iteration on its own, then the slowest rank's time per
 *     iteration (one MAX allreduce of all of them), median and min..max;
 *   - iterations per size 512 MiB / size clamped to 5..200 (--iters N).
 * Output: the same columns as `distopt bench comm` (size, count, median us,
 * min..max us, algbw = bytes / median, busbw = algbw * 2(n-1)/n).
 *
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c  (tools/bench/compare_mpi.py
 * does this when mpicc is found). Run: mpirun -np 2 ./mpi_allreduce. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t min_bytes = 4096, max_bytes = 64u << 20;
  int iters_arg = 0, warmup_arg = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--min-bytes"))
      min_bytes = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--max-bytes"))
      max_bytes = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "--iters"))
      iters_arg = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--warmup"))
      warmup_arg = atoi(argv[i + 1]);
    else {
      if (rank == 0) fprintf(stderr, "mpi_allreduce: unknown option %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  const size_t max_count = max_bytes / 4;
  float* send = malloc(max_count * sizeof(float));
  float* recv = malloc(max_count * sizeof(float));
  double* secs = malloc(200 * sizeof(double) + 4096);
  if (!send || !recv || !secs) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < max_count; ++i) send[i] = 1.0f, recv[i] = 0.0f;
  if (rank == 0) {
    printf("# mpi_allreduce: MPI_Allreduce float32 sum, %d ranks\n", n);
    printf("# time: median over the iterations of the slowest rank's time; min..max beside it\n");
    printf("# %12s %12s %12s %21s %12s %12s\n", "size(B)", "count", "time(us)", "min..max(us)",
           "algbw(GB/s)", "busbw(GB/s)");
  }
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = (int)(bytes / 4);
    size_t it = (512u << 20) / bytes;
    if (it < 5) it = 5;
    if (it > 200) it = 200;
    const int iters = iters_arg > 0 ? (iters_arg > 200 ? 200 : iters_arg) : (int)it;
    const int warmup = bytes == min_bytes && warmup_arg < 20 ? 20 : warmup_arg;
    for (int i = 0; i < warmup; ++i)
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters; ++i) {
      const double t0 = MPI_Wtime();
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      secs[i] = MPI_Wtime() - t0;
    }
    if (recv[0] != (float)n || recv[count - 1] != (float)n) {
      fprintf(stderr, "mpi_allreduce: rank %d: wrong sum %g at %zu bytes\n", rank, recv[0], bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Allreduce(MPI_IN_PLACE, secs, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(secs, (size_t)iters, sizeof(double), cmp_double);
    const double median =
        iters % 2 ? secs[iters / 2] : 0.5 * (secs[iters / 2 - 1] + secs[iters / 2]);
    const double algbw = (double)bytes / median / 1e9;
    if (rank == 0) {
      char range[64];
      snprintf(range, sizeof range, "%.1f..%.1f", secs[0] * 1e6, secs[iters - 1] * 1e6);
      printf("  %12zu %12d %12.1f %21s %12.3f %12.3f\n", bytes, count, median * 1e6, range, algbw,
             algbw * 2.0 * (n - 1) / n);
      fflush(stdout);
    }
  }
  free(send);
  free(recv);
  free(secs);
  MPI_Finalize();
  return 0;
}
