// Shared-memory segments for the ranks of a communicator that are on one
// host (the transport under shm_collectives.hpp): a POSIX shm object per
// rank, mapped by every rank, with the process-shared round counters that
// order the collectives, and the waiting policy around them (spin, yield,
// then sleep on a futex in short slices so deadlines, aborts and peer
// failures are seen). The design follows NCCL's SHM transport and UCX's
// uct/sm (mm over posix shm): one mapped FIFO per peer, flags polled in
// shared memory, no kernel copy.
//
// Header-only, torch-free; Linux only (shm_open, futex). Older glibc needs
// -lrt for shm_open.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE2__))
#include <emmintrin.h>
#define DOPT_SHM_STREAM_STORES 1
#endif

#include "distopt/abi.h"
#include "distopt/sdk/base/fault_point.hpp"

namespace distopt::sdk::shm {

using Clock = std::chrono::steady_clock;

/// The header at the start of every rank's segment. Counters hold round
/// numbers (1, 2, ...; 0 = none yet) and only grow; each on its own cache
/// line so a rank publishing one does not slow down peers polling another.
struct Header {
  alignas(64) std::atomic<uint64_t> ready;    ///< this rank's input of round k is in its slot
  alignas(64) std::atomic<uint64_t> reduced;  ///< this rank's slice of round k is reduced
  alignas(64) std::atomic<uint64_t> done;  ///< this rank finished reading peers' slots of round k
  /// Hints for an allreduce on the calling thread: this rank's caller is at
  /// round k's collective, an allreduce of arrived_bytes.
  alignas(64) std::atomic<uint64_t> arrived;
  std::atomic<uint64_t> arrived_bytes;
  /// The collective this rank runs: (its first round << 24) | a 24-bit
  /// signature of its kind, size, dtype, reduction and root, set before its
  /// first `ready`. A peer that finds another collective at the rounds it
  /// reads fails with "collective mismatch" instead of mixing them.
  alignas(64) std::atomic<uint64_t> op;
  alignas(64) std::atomic<uint32_t> futex;  ///< bumped on every publish; waiters sleep on it
  std::atomic<uint32_t> waiters;  ///< ranks sleeping on `futex` (publisher skips the wake if 0)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "process-shared counters must be lock-free (address-free)");

/// Data starts one page in; the rest of the segment is two equal slots.
constexpr size_t kDataOffset = 4096;

namespace detail {

inline std::string sys_error(const std::string& what, const std::string& name) {
  return what + " '" + name + "': " + std::strerror(errno);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The futex word is a std::atomic<uint32_t> in shared memory: lock-free, so
// its object representation is the plain 32-bit word the kernel compares.
// Non-private futexes: the waiters are in other processes.
inline int futex_wait(std::atomic<uint32_t>* w, uint32_t expect, long ns) {
  timespec ts{0, ns};
  return static_cast<int>(
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, expect, &ts, nullptr, 0));
}
inline void futex_wake_all(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

/// "mnt:[4026531841]", or "" where /proc does not say.
inline std::string namespace_id(const char* link) {
  char ns[128] = {};
  ssize_t k = readlink(link, ns, sizeof ns - 1);
  return k > 0 ? std::string(ns, static_cast<size_t>(k)) : std::string();
}

}  // namespace detail

/// One mapped segment. Owns the mapping; the creator also owns the name
/// until unlink() (called once every peer has mapped it, so a crash leaks
/// nothing in /dev/shm). Movable, not copyable; not thread-safe.
class Segment {
 public:
  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept {
    if (this != &o) {
      release();  // not ~Segment(): name_ must stay a live string to be assigned
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      name_ = std::move(o.name_);
      owner_linked_ = std::exchange(o.owner_linked_, false);
    }
    return *this;
  }
  /// Unlinks (creator) and unmaps.
  ~Segment() { release(); }

  /// Create a fresh, uniquely named segment of `bytes` bytes (O_EXCL, mode
  /// 0600), its header zeroed. Throws std::runtime_error (shm_open,
  /// ftruncate or mmap failed; the message names the segment and errno).
  static Segment create(size_t bytes) {
    static std::atomic<uint64_t> seq{0};  // unique per process and call
    std::random_device rd;
    Segment s;
    int fd = -1;
    for (int attempt = 0; fd < 0; ++attempt) {
      s.name_ = "/distopt-" + std::to_string(getpid()) + "-" + std::to_string(seq.fetch_add(1)) +
                "-" + std::to_string(rd() & 0xffffff);
      fd = shm_open(s.name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0 && (errno != EEXIST || attempt > 8))
        throw std::runtime_error(detail::sys_error("shm_open", s.name_));
    }
    s.owner_linked_ = true;  // from here on the destructor unlinks on failure
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      std::string why = detail::sys_error("ftruncate", s.name_);
      close(fd);
      throw std::runtime_error(why);
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) throw std::runtime_error(detail::sys_error("mmap", s.name_));
    s.base_ = p;
    s.bytes_ = bytes;
    new (p) Header{};  // the counters start at 0 (the pages are zero too)
    return s;
  }

  /// Map a peer's segment by name; its size must be `bytes`. Throws
  /// std::runtime_error (missing, wrong size, or mmap failed).
  static Segment open(const std::string& name, size_t bytes) {
    int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error(detail::sys_error("shm_open", name));
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      throw std::runtime_error("shared-memory segment '" + name + "' has an unexpected size");
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) throw std::runtime_error(detail::sys_error("mmap", name));
    Segment s;
    s.base_ = p;
    s.bytes_ = bytes;
    s.name_ = name;
    return s;
  }

  /// Remove the name from /dev/shm (the mapping stays valid). Idempotent;
  /// only the creator unlinks.
  void unlink() {
    if (!owner_linked_) return;
    shm_unlink(name_.c_str());
    owner_linked_ = false;
  }

  const std::string& name() const { return name_; }
  Header* header() const { return static_cast<Header*>(base_); }
  /// Slot i (0 or 1) when each slot is `slot_bytes` bytes.
  char* slot(int i, size_t slot_bytes) const {
    return static_cast<char*>(base_) + kDataOffset + static_cast<size_t>(i) * slot_bytes;
  }

 private:
  void release() noexcept {
    unlink();
    if (base_) munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_linked_ = false;  ///< created here and not yet unlinked
};

/// Identifies "the same host and the same /dev/shm": boot id, hostname,
/// mount namespace and network namespace. Ranks with equal ids can map each
/// other's segments; ranks in different network namespaces are treated as
/// different hosts even where they could (containers, pods, the netns test:
/// they share /dev/shm unless their mount namespaces differ too), so they
/// talk over their network. Never throws (missing parts read as "").
inline std::string host_id() {
  std::string id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, id);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return id + "|" + host + "|" + detail::namespace_id("/proc/self/ns/mnt") + "|" +
         detail::namespace_id("/proc/self/ns/net");
}

/// Publish `value` in `counter` (a field of header `h`) and wake the ranks
/// sleeping on `h`. Any thread; release ordering (what was written before
/// is visible to a rank that sees the value).
inline void publish(Header* h, std::atomic<uint64_t>& counter, uint64_t value) {
  counter.store(value, std::memory_order_release);
  // seq_cst bump + waiters check pair with the waiter's register-then-recheck:
  // either it sees the new value or we see it registered and wake it.
  h->futex.fetch_add(1, std::memory_order_seq_cst);
  if (h->waiters.load(std::memory_order_seq_cst) > 0) detail::futex_wake_all(&h->futex);
}

/// Copy `n` bytes to `dst` in shared memory with non-temporal (streaming)
/// stores where the CPU has them (x86-64: SSE2 movntdq), then a store
/// fence, so a release store published after it orders them too. Streaming
/// stores skip the read-for-ownership of each line and take it out of every
/// cache: slower than memcpy when the peers would have read the lines from
/// a neighbouring cache, much faster when writing a line a peer still
/// caches is expensive (seen on a 2-vCPU KVM guest: a 1 MiB 2-rank
/// allreduce at 0.55-0.65 ms against 0.13 ms, in periods that come and go;
/// BENCHMARKS.md). Elsewhere a plain memcpy. Any thread; no alignment
/// needed.
inline void stream_copy(char* dst, const char* src, size_t n) {
#ifdef DOPT_SHM_STREAM_STORES
  size_t i = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, i);
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

/// How a rank writes into its own segment (the shm_stores option).
enum class Stores {
  automatic,  ///< whichever of plain and streaming has copied faster lately (WriteTuner)
  plain,      ///< memcpy: peers read the lines from this core's cache
  streaming,  ///< stream_copy: the lines go to memory, out of every cache
};

/// Parses "auto", "plain" or "streaming"; false for anything else.
inline bool parse_stores(const std::string& s, Stores* out) {
  if (s == "auto")
    *out = Stores::automatic;
  else if (s == "plain")
    *out = Stores::plain;
  else if (s == "streaming")
    *out = Stores::streaming;
  else
    return false;
  return true;
}

/// How a rank writes its input into its own segment: plain stores
/// (memcpy) or streaming ones (stream_copy). With Stores::automatic,
/// whichever has copied faster lately: which one is faster depends on where
/// the host placed the cores, and on a VM it changes over time, so the
/// tuner measures instead of guessing. It times every copy of at least
/// kMinBytes, keeps a moving average of seconds per byte for each way, and
/// uses the other way for one copy in every kExplore to keep that average
/// current. The choice is local to a rank (peers read the data the same
/// either way) and never changes the bytes. Not thread-safe: one per
/// Collectives per size class.
class WriteTuner {
 public:
  /// Copies below this run as memcpy, untimed (Stores::automatic):
  /// cache-resident, and a clock read would be a visible part of them.
  static constexpr size_t kMinBytes = 64 << 10;
  /// One timed copy in this many goes the way not in use.
  static constexpr unsigned kExplore = 16;
  /// Streaming is chosen only below this fraction of plain's time. Its cost
  /// to the peers (their reads come from memory, not from this core's
  /// cache) is not in its own time: at 128-256 KiB, where plain copies
  /// measured up to 2.9x streaming's from noise alone, streaming made the
  /// allreduce 1.2-1.7x slower. The slow placements it is for put plain
  /// at 6-15x.
  static constexpr double kMargin = 0.25;

  explicit WriteTuner(Stores mode = Stores::automatic) : mode_(mode) {}

  /// Copy `n` bytes from `src` (private memory) to `dst` (this rank's
  /// segment); peers see the data after a release store that follows
  /// (publish()).
  void copy(char* dst, const char* src, size_t n) {
    if (mode_ != Stores::automatic || n < kMinBytes) {
      if (mode_ == Stores::streaming)
        stream_copy(dst, src, n);
      else
        std::memcpy(dst, src, n);
      return;
    }
    const int way = next_way();
    const auto t0 = Clock::now();
    if (way == 1)
      stream_copy(dst, src, n);
    else
      std::memcpy(dst, src, n);
    record(way, std::chrono::duration<double>(Clock::now() - t0).count() / n);
  }
  /// Whether this rank's other writes into its segment (an allreduce's
  /// reduced slice) should stream too: the mode, or the current choice.
  bool streaming() const {
    return mode_ == Stores::streaming || (mode_ == Stores::automatic && best() == 1);
  }

  /// The way (0 plain, 1 streaming) for the next timed copy: each way twice
  /// first (the first copy of a way pays for page faults and cold caches and
  /// is not counted), then the faster, and the other now and then.
  int next_way() {
#ifdef DOPT_SHM_STREAM_STORES
    if (measured_[0] < 2) return 0;
    if (measured_[1] < 2) return 1;
    return ++copies_ % kExplore == 0 ? 1 - best() : best();
#else
    return 0;
#endif
  }
  /// Count a timed copy: `seconds_per_byte` for way 0 (plain) or 1.
  void record(int way, double seconds_per_byte) {
    if (measured_[way]++ == 0) return;
    double& a = avg_[way];
    // A copy preempted midway says nothing about the stores: at most 4x.
    a = a == 0 ? seconds_per_byte : 0.75 * a + 0.25 * std::min(seconds_per_byte, 4 * a);
  }
  /// Moving average of seconds per byte for way 0 (plain) or 1 (0: none yet).
  double seconds_per_byte(int way) const { return avg_[way]; }

 private:
  int best() const { return avg_[1] > 0 && avg_[0] > 0 && avg_[1] < kMargin * avg_[0] ? 1 : 0; }

  Stores mode_;
  double avg_[2] = {0, 0};
  unsigned measured_[2] = {0, 0};  ///< timed copies per way, the first included
  unsigned copies_ = 0;
};

/// How long a wait may go on, and what ends it early.
struct WaitCtx {
  Clock::time_point deadline;                ///< the operation's timeout
  const std::atomic<bool>* abort = nullptr;  ///< set when the communicator fails or is destroyed
  FaultPoint* fault =
      nullptr;  ///< test-only fault injection (sdk/base/fault_point.hpp); may be null
  /// Per rank (indexed by rank), may be null: set once that rank closed the
  /// communicator (e.g. tcp's goodbye on its control channel); a wait on it
  /// can then never complete.
  const std::atomic<bool>* peer_left = nullptr;
  /// May be empty. Called by the waiting thread between sleeps (about every
  /// 2 ms once a wait has spun and yielded): returns a rank that failed,
  /// its cause in *why, or -1. How a communicator whose failure detection needs
  /// driving (ucx: ucp_worker_progress runs the UCP error callbacks) feeds
  /// peer failures into a wait.
  std::function<int(std::string* why)> peer_failed;
};

/// Why a wait ended with DOPT_ERR_COMM.
struct WaitError {
  int peer = -1;    ///< the rank that left or failed
  std::string why;  ///< from WaitCtx::peer_failed; "" when the rank left (peer_left)
};

/// How a waiter gives its core away (wait()). The defaults suit ranks that
/// each have a core; oversubscribed() is for more ranks than cores.
struct WaitPolicy {
  int spin = 256;                 ///< cpu_relax() rounds before the first yield
  double yield_seconds = 200e-6;  ///< then sched_yield() for this long, then the futex
  /// More ranks than cores: no spinning, and the futex after 20 us. A
  /// yielding rank does not reliably hand its core to the peer it waits
  /// for; 4 ranks on 2 cores ran 4-16 KiB allreduces about 1.4x faster
  /// (median of 8 interleaved runs; BENCHMARKS.md). With a core per rank
  /// the defaults stay: there a short yield phase made 8 KiB 0.65-0.9x.
  static WaitPolicy oversubscribed() { return WaitPolicy{0, 20e-6}; }
};

/// Wait until `counter` (in peer header `h`) reaches `value`: spin briefly,
/// then yield, then sleep on the header's futex in 2 ms slices so the
/// deadline, the abort flag, `peer_left` (the waited-for rank's flag, may be
/// null) and ctx.peer_failed are checked. Returns DOPT_OK, DOPT_ERR_ABORTED,
/// DOPT_ERR_COMM (that rank left or a rank failed; *err says which, if
/// non-null) or DOPT_ERR_TIMEOUT. One waiting thread per counter and rank.
inline dopt_status wait(Header* h, const std::atomic<uint64_t>& counter, uint64_t value,
                        const WaitCtx& ctx, const std::atomic<bool>* peer_left = nullptr,
                        WaitError* err = nullptr, const WaitPolicy& policy = WaitPolicy{}) {
  // Brief spin: on an idle core the peer is usually microseconds away.
  for (int i = 0; i < policy.spin; ++i) {
    if (counter.load(std::memory_order_acquire) >= value) return DOPT_OK;
    detail::cpu_relax();
  }
  // Then give the core away: with more ranks than cores the peer we wait for
  // may need this very core. Yields for up to policy.yield_seconds, then
  // sleep on the futex. The yield phase must outlast a futex wake-up (20-30 us on a
  // VM): a rank that sleeps makes its peer wait that long, the peer then
  // sleeps in turn, and two ranks stay in that rhythm (seen: 4-256 KiB
  // allreduces at 20-50 us instead of 1-15).
  const auto yield_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(policy.yield_seconds));
  bool yielding = true;
  for (int i = 0;; ++i) {
    if (counter.load(std::memory_order_acquire) >= value) return DOPT_OK;
    if (ctx.abort && ctx.abort->load(std::memory_order_acquire)) return DOPT_ERR_ABORTED;
    if (peer_left && peer_left->load(std::memory_order_acquire) &&
        counter.load(std::memory_order_acquire) < value)
      return DOPT_ERR_COMM;
    if (!yielding && ctx.peer_failed) {  // between sleeps only: it may cost microseconds
      std::string why;
      const int p = ctx.peer_failed(&why);
      if (p >= 0 && counter.load(std::memory_order_acquire) < value) {
        if (err) *err = WaitError{p, why};
        return DOPT_ERR_COMM;
      }
    }
    const auto now = Clock::now();
    if (now >= ctx.deadline) return DOPT_ERR_TIMEOUT;
    if (yielding && (i < 16 || now < yield_until)) {
      sched_yield();
      continue;
    }
    yielding = false;
    uint32_t seen = h->futex.load(std::memory_order_seq_cst);
    h->waiters.fetch_add(1, std::memory_order_seq_cst);
    if (counter.load(std::memory_order_seq_cst) < value)
      detail::futex_wait(&h->futex, seen, 2'000'000);  // 2 ms: abort, deadline stay prompt
    h->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace distopt::sdk::shm
