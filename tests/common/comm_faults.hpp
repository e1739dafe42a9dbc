// Failure handling every communicator must show (tests/comm/tcp_test.cpp,
// tests/ucx/ucx_test.cpp): a rank that stops (SIGSTOP, as behind a cut link)
// or dies mid-collective, seen from the ranks that survive it. Run inside a
// forked rank.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"

namespace distopt::test {

/// Stops this process (SIGSTOP) until a child it forks resumes it
/// (SIGCONT) `seconds` later: no EOF, no RST, the peers just hear nothing.
inline void stop_self_for(unsigned seconds) {
  const pid_t self = getpid();
  if (fork() == 0) {  // only async-signal-safe calls in the child
    sleep(seconds);
    kill(self, SIGCONT);
    _exit(0);
  }
  raise(SIGSTOP);
}

/// On rank `me`, while rank `dead` dies during it (DISTOPT_FAULT_INJECT):
/// waiting on the in-place sum allreduce of `t` must throw a CommError with
/// DOPT_ERR_COMM naming "rank <dead>" and "allreduce", and a later barrier
/// must throw naming it too. Returns 0 if so; else 1 (the allreduce
/// completed), 2 (another error), 3 (the barrier completed), 4 (its error
/// names no rank), 5 (rank `dead` itself got through: the fault point was
/// not reached). Says why on stderr.
inline int check_dead_peer_named(Communicator& comm, DLTensor& t, int me, int dead) {
  const std::string who = "rank " + std::to_string(dead);
  try {
    comm.allreduce(t, t, DOPT_REDUCE_SUM).wait();
    if (me == dead) return 5;
    fprintf(stderr, "rank %d: allreduce completed without rank %d\n", me, dead);
    return 1;
  } catch (const CommError& e) {
    if (e.status() != DOPT_ERR_COMM || !std::strstr(e.what(), who.c_str()) ||
        !std::strstr(e.what(), "allreduce")) {
      fprintf(stderr, "rank %d: unexpected error: %s\n", me, e.what());
      return 2;
    }
  }
  try {  // every later operation fails too, at once
    comm.barrier().wait();
    return 3;
  } catch (const CommError& e) {
    if (!std::strstr(e.what(), who.c_str())) {
      fprintf(stderr, "rank %d: later op: %s\n", me, e.what());
      return 4;
    }
  }
  return 0;
}

}  // namespace distopt::test
