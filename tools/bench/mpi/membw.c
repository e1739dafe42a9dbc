/* Aggregate memory copy bandwidth of N concurrent processes: the memory
 * bound that tools/bench/compare_pytorch.py sets beside a shared-memory
 * allreduce (issue 23). Each of --procs processes (forked) copies its own
 * --bytes buffer into another with memcpy --iters times after 2 untimed
 * copies; all start together (a pipe barrier). Prints one line:
 *   membw procs=N bytes=B GB/s=X
 * where X counts bytes read plus bytes written by all processes over the
 * slowest process's time, the median of --repeat runs.
 *
 * --pingpong: instead, two processes pass a counter back and forth through
 * one shared cache line (spinning, no system call) --iters times; prints
 *   pingpong oneway_us=X
 * half the median round trip: the least time in which one process can see
 * what another wrote, the latency term of issue 23's bound.
 *
 * --handoff: instead, two processes take turns through one shared buffer of
 * --bytes: one copies its own buffer in, the other copies it out into its
 * own, then the roles swap (spinning on a shared flag, 20 untimed turns,
 * then --iters timed ones); prints
 *   handoff bytes=B GB/s=X
 * X = bytes handed over per second, the median of --repeat runs: what one
 * process can pass to another through shared memory when nothing else runs
 * (a copy in and a copy out in series, across cores).
 *
 * --cma: instead, one process reads another's --bytes buffer with
 * process_vm_readv (cross-memory attach: one kernel copy, no shared
 * segment) --iters times after 2 untimed reads; prints
 *   cma bytes=B GB/s=X
 * X = bytes read per second, the median of --repeat runs: what an
 * allreduce that reads its peers' own tensors would pay per byte.
 * Build: cc -O2 -o membw membw.c */
#define _GNU_SOURCE /* process_vm_readv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Median one-way latency in seconds over `repeat` runs of `iters` round trips. */
static double pingpong(int iters, int repeat) {
  volatile long* flag = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (flag == MAP_FAILED) return -1;
  double* t = calloc((size_t)repeat, sizeof(double));
  for (int rep = 0; rep < repeat; ++rep) {
    *flag = 0;
    pid_t child = fork();
    if (child == 0) { /* answers odd values with the next even one */
      for (long i = 1; i < 2L * (iters + 10); i += 2) {
        while (*flag != i) {
        }
        *flag = i + 1;
      }
      _exit(0);
    }
    double t0 = 0;
    for (long i = 1; i < 2L * (iters + 10); i += 2) {
      if (i == 21) t0 = now(); /* 10 untimed round trips */
      *flag = i;
      while (*flag != i + 1) {
      }
    }
    t[rep] = (now() - t0) / iters / 2;
    waitpid(child, NULL, 0);
  }
  qsort(t, (size_t)repeat, sizeof(double), cmp);
  return t[repeat / 2];
}

/* Median bytes per second over `repeat` runs of `iters` handoffs of `bytes`. */
static double handoff(size_t bytes, int iters, int repeat) {
  char* shared =
      mmap(NULL, bytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return -1;
  volatile long* turn = (volatile long*)(shared + bytes);
  double* t = calloc((size_t)repeat, sizeof(double));
  for (int rep = 0; rep < repeat; ++rep) {
    *turn = 0;
    pid_t child = fork();
    const int me = child == 0; /* turn k: process k % 2 writes, the other reads */
    char* own = malloc(bytes);
    memset(own, me + 1, bytes);
    double t0 = 0;
    for (long k = 0; k < iters + 20; ++k) {
      if (k == 20) t0 = now();
      if ((k & 1) == me) {
        while (*turn != 2 * k) {
        }
        memcpy(shared, own, bytes);
        __sync_synchronize();
        *turn = 2 * k + 1;
      } else {
        while (*turn != 2 * k + 1) {
        }
        memcpy(own, shared, bytes);
        __sync_synchronize();
        *turn = 2 * k + 2;
      }
    }
    if (me) _exit(0);
    t[rep] = (double)bytes * iters / (now() - t0);
    waitpid(child, NULL, 0);
    free(own);
  }
  qsort(t, (size_t)repeat, sizeof(double), cmp);
  return t[repeat / 2];
}

/* Median bytes per second over `repeat` runs of `iters` CMA reads of a
 * child's `bytes`; -1 when the kernel refuses (ptrace scope, seccomp). */
static double cma(size_t bytes, int iters, int repeat) {
  int addr[2], done[2];
  if (pipe(addr) || pipe(done)) return -1;
  pid_t child = fork();
  if (child == 0) { /* holds a touched buffer until told to go */
    char* b = malloc(bytes);
    memset(b, 1, bytes);
    if (write(addr[1], &b, sizeof b) != sizeof b) _exit(1);
    char c;
    if (read(done[0], &c, 1) != 1) _exit(1);
    _exit(0);
  }
  void* remote = NULL;
  if (read(addr[0], &remote, sizeof remote) != sizeof remote) return -1;
  char* local = malloc(bytes);
  memset(local, 0, bytes);
  double* t = calloc((size_t)repeat, sizeof(double));
  double rate = -1;
  for (int rep = 0; rep < repeat; ++rep) {
    struct iovec l = {local, bytes}, r = {remote, bytes};
    double t0 = 0;
    for (int i = 0; i < iters + 2; ++i) {
      if (i == 2) t0 = now();
      if (process_vm_readv(child, &l, 1, &r, 1, 0) != (ssize_t)bytes) {
        perror("membw: process_vm_readv");
        goto out;
      }
    }
    t[rep] = (double)bytes * iters / (now() - t0);
  }
  qsort(t, (size_t)repeat, sizeof(double), cmp);
  rate = t[repeat / 2];
out:
  if (write(done[1], "x", 1) != 1) rate = -1;
  waitpid(child, NULL, 0);
  return rate;
}

int main(int argc, char** argv) {
  int procs = 2, iters = 10, repeat = 5, ping = 0, hand = 0, cm = 0;
  size_t bytes = 64u << 20;
  for (int i = 1; i < argc; i += 2) {
    if (!strcmp(argv[i], "--pingpong") || !strcmp(argv[i], "--handoff") ||
        !strcmp(argv[i], "--cma")) {
      ping = !strcmp(argv[i], "--pingpong");
      hand = !strcmp(argv[i], "--handoff");
      cm = !strcmp(argv[i], "--cma");
      --i; /* takes no value */
    } else if (i + 1 >= argc) {
      fprintf(stderr, "membw: %s needs a value\n", argv[i]);
      return 2;
    } else if (!strcmp(argv[i], "--procs"))
      procs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--bytes"))
      bytes = strtoull(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--iters"))
      iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--repeat"))
      repeat = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "membw: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (ping) {
    printf("pingpong oneway_us=%.3f\n", pingpong(iters, repeat) * 1e6);
    return 0;
  }
  if (hand) {
    printf("handoff bytes=%zu GB/s=%.2f\n", bytes, handoff(bytes, iters, repeat) / 1e9);
    return 0;
  }
  if (cm) {
    const double r = cma(bytes, iters, repeat);
    if (r < 0) return 1;
    printf("cma bytes=%zu GB/s=%.2f\n", bytes, r / 1e9);
    return 0;
  }
  double* rates = calloc((size_t)repeat, sizeof(double));
  for (int rep = 0; rep < repeat; ++rep) {
    int go[2], back[2];
    if (pipe(go) || pipe(back)) return 1;
    for (int p = 0; p < procs; ++p) {
      if (fork() == 0) {
        char* a = malloc(bytes);
        char* b = malloc(bytes);
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        memcpy(b, a, bytes);
        memcpy(a, b, bytes);
        char c;
        if (read(go[0], &c, 1) != 1) _exit(1);
        const double t0 = now();
        for (int i = 0; i < iters; ++i) memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
        const double dt = now() - t0;
        if (write(back[1], &dt, sizeof dt) != sizeof dt) _exit(1);
        _exit(0);
      }
    }
    usleep(200000); /* every child has warmed up */
    for (int p = 0; p < procs; ++p)
      if (write(go[1], "g", 1) != 1) return 1;
    double slowest = 0;
    for (int p = 0; p < procs; ++p) {
      double dt = 0;
      if (read(back[0], &dt, sizeof dt) != sizeof dt) return 1;
      if (dt > slowest) slowest = dt;
    }
    while (wait(NULL) > 0) {
    }
    close(go[0]), close(go[1]), close(back[0]), close(back[1]);
    rates[rep] = 2.0 * (double)bytes * iters * procs / slowest / 1e9;
  }
  qsort(rates, (size_t)repeat, sizeof(double), cmp);
  printf("membw procs=%d bytes=%zu GB/s=%.2f\n", procs, bytes, rates[repeat / 2]);
  return 0;
}
