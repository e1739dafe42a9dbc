// A communicator vtable that forwards to a plugin's and fingerprints every
// collective (kind, position, size, dtype, root, reduction). Waits run in
// slices of `stall_after`; a slice that ends with the collective still
// pending asks the MismatchDetector whether the ranks disagree. Plugins and
// the host use the wrapper exactly as the plugin's own communicator.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "distopt/communicator.h"

namespace distopt {
class Store;
}

namespace distopt::comm_check {

/// A collective that fails waits at most this long (and at most one
/// `stall_after`) for the other ranks' posts before reporting; a launcher
/// that stops survivors sooner than this after a failure loses their report.
constexpr int64_t kFailurePatienceCapMs = 3000;

struct Settings {
  std::shared_ptr<Store> store;  ///< the job's rendezvous store
  std::string prefix;            ///< store key prefix, identical on every rank
  std::string comm_name;         ///< for messages ("tcp")
  std::chrono::milliseconds stall_after{1000};
  /// How long a failed collective waits for the others' posts; negative:
  /// min(stall_after, kFailurePatienceCapMs). Elastic jobs use 0: they
  /// recover from a dead peer rather than wait to explain it.
  std::chrono::milliseconds failure_patience{-1};
};

/// Wrap `inner` (ownership moves to the wrapper: destroying the returned
/// communicator through its vtable destroys `inner`). Requests made through
/// the wrapper must be waited / tested / freed through it.
dopt_comm_ref wrap(dopt_comm_ref inner, Settings settings);

}  // namespace distopt::comm_check
