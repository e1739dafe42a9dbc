// Shared-memory segments for ranks on one host: a POSIX shm object per rank,
// mapped by every rank of the communicator, with the process-shared sequence
// counters that order the collectives, and the waiting policy around them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "distopt/abi.h"
#include "distopt/sdk/fault_point.hpp"
#include "socket.hpp"

namespace distopt::plugins::tcp {

using sdk::FaultPoint;

/// The header at the start of every rank's segment. Counters hold round
/// numbers (1, 2, ...; 0 = none yet) and only grow; each on its own cache line
/// so a rank publishing one does not slow down peers polling another.
struct ShmHeader {
  alignas(64) std::atomic<uint64_t> ready;    ///< this rank's input of round k is in its slot
  alignas(64) std::atomic<uint64_t> reduced;  ///< this rank's slice of round k is reduced
  alignas(64) std::atomic<uint64_t> done;   ///< this rank finished reading peers' slots of round k
  alignas(64) std::atomic<uint32_t> futex;  ///< bumped on every publish; waiters sleep on it
  std::atomic<uint32_t> waiters;  ///< ranks sleeping on `futex` (publisher skips the wake if 0)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "process-shared counters must be lock-free (address-free)");

/// Data starts one page in; the rest of the segment is two equal slots.
constexpr size_t kShmDataOffset = 4096;

/// One mapped segment. Owns the mapping; the creator also owns the name until
/// unlink() (called once every peer has mapped it, so a crash leaks nothing).
class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ~ShmSegment();

  /// Create a fresh, uniquely named segment of `bytes` (O_EXCL). Throws std::runtime_error.
  static ShmSegment create(size_t bytes);
  /// Map a peer's segment by name; its size must be `bytes`. Throws std::runtime_error.
  static ShmSegment open(const std::string& name, size_t bytes);

  /// Remove the name (mapping stays valid). Idempotent; only the creator unlinks.
  void unlink();

  const std::string& name() const { return name_; }
  ShmHeader* header() const { return static_cast<ShmHeader*>(base_); }
  char* slot(int i, size_t slot_bytes) const {
    return static_cast<char*>(base_) + kShmDataOffset + static_cast<size_t>(i) * slot_bytes;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_linked_ = false;  ///< created here and not yet unlinked
};

/// Identifies "the same host and the same /dev/shm": boot id, hostname,
/// mount namespace and network namespace. Ranks with equal ids can map each
/// other's segments; ranks in different network namespaces are treated as
/// different hosts even where they could (they share /dev/shm unless their
/// mount namespaces differ too), so they talk over their network.
std::string shm_host_id();

/// Publish a counter value and wake ranks sleeping on this header.
void shm_publish(ShmHeader* h, std::atomic<uint64_t>& counter, uint64_t value);

/// How long a wait may go on: the operation's deadline and the communicator's abort flag.
struct ShmWaitCtx {
  Clock::time_point deadline;
  const std::atomic<bool>* abort = nullptr;
  FaultPoint* fault = nullptr;  ///< test-only fault injection (sdk/fault_point.hpp)
  /// Per rank: set once that rank closed the communicator (its goodbye on the
  /// control channel); a wait on it can then never complete.
  const std::atomic<bool>* peer_left = nullptr;
};

/// Wait until `counter` (in peer header `h`) reaches `value`: spin briefly,
/// then yield, then sleep on the header's futex in short slices so the
/// deadline, the abort flag and `peer_left` (the waited-for rank's goodbye,
/// may be null) are checked. Returns DOPT_OK, DOPT_ERR_ABORTED,
/// DOPT_ERR_COMM (that rank left) or DOPT_ERR_TIMEOUT.
dopt_status shm_wait(ShmHeader* h, const std::atomic<uint64_t>& counter, uint64_t value,
                     const ShmWaitCtx& ctx, const std::atomic<bool>* peer_left = nullptr);

}  // namespace distopt::plugins::tcp
