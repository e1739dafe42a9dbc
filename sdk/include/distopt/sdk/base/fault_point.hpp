// Test-only fault injection, so a test kills a rank at a point it controls
// instead of after a sleep that a fast machine outruns:
//   DISTOPT_FAULT_INJECT=comm_exit:RANK:OP:BYTES
// ends rank RANK's process with _exit(0) (no goodbye to peers, as a crash)
// once it has handed BYTES bytes of its OP-th collective (1-based, counted on
// this communicator's progress thread) to its peers, on a socket or in
// shared memory. Other DISTOPT_FAULT_INJECT values belong to the core.
// Used by the tcp and ucx communicators. Thread safety: one thread at a time
// (the one running the collective: the progress thread, or the caller of a
// calling-thread allreduce, p2p::ShellSetup::inline_shm_bytes).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace distopt::sdk {

class FaultPoint {
 public:
  /// Disabled unless the variable names `rank`.
  static FaultPoint from_env(int rank) {
    FaultPoint f;
    const char* v = std::getenv("DISTOPT_FAULT_INJECT");
    if (!v || std::strncmp(v, "comm_exit:", 10) != 0) return f;
    int r = -1;
    unsigned long long op = 0, bytes = 0;
    if (std::sscanf(v + 10, "%d:%llu:%llu", &r, &op, &bytes) == 3 && r == rank) {
      f.op_ = op;
      f.bytes_ = bytes;
    }
    return f;
  }
  /// Progress thread, at the start of every collective.
  void begin_op() {
    ++ops_;
    sent_ = 0;
  }
  /// Progress thread, after `n` more bytes became visible to a peer.
  void sent(uint64_t n) {
    if (op_ == 0 || ops_ != op_) return;
    sent_ += n;
    if (sent_ >= bytes_) _exit(0);
  }

 private:
  uint64_t op_ = 0, bytes_ = 0;  // op_ 0: disabled
  uint64_t ops_ = 0, sent_ = 0;
};

}  // namespace distopt::sdk
