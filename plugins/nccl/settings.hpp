// The `nccl` communicator's options (declared in plugin.cpp) as one struct.
#pragma once

#include <chrono>
#include <cstdint>

#include "distopt/abi.h"

namespace distopt::plugins::nccl {

struct Settings {
  double timeout_s = 600;     ///< per operation, from its launch (and init)
  int64_t device = -1;        ///< CUDA device; -1: local_rank % device count
  double abort_grace_s = 60;  ///< ncclCommAbort may take this long, then the process ends
  int64_t watchdog_poll_ms = 100;

  /// From the validated options (nullptr: the defaults above).
  static Settings from(const dopt_options* options);
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  }
};

}  // namespace distopt::plugins::nccl
