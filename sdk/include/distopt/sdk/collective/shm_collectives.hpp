// Collectives over shared memory, for a communicator whose ranks are all on
// one host: any communicator (tcp, ucx, out-of-tree ones) creates a
// shm::Collectives through the rendezvous store and runs allreduce,
// reduce_scatter, allgather and broadcast through it, keeping its own
// network path for the rest and for ranks on several hosts. The design is
// NCCL's SHM transport and UCX's uct/sm: each rank copies its input into
// its own segment once, reduces its 1/W slice reading the peers' segments
// directly, and copies the result out. No kernel copies, no socket wakeups.
//
// Tensors stream through in rounds of one slot (half a segment; the two
// slots alternate, so a rank fills round k+1 while peers still read round
// k). The round number is global to the communicator (every rank runs the
// same operations in the same order on one thread), and each rank publishes
// three counters per round in its header (shm::Header):
//   ready   its input is in its slot;
//   reduced its slice of the slot holds the final values (allreduce only);
//   done    it has finished reading every peer's slot of that round.
// A rank overwrites its slot for round k only after every peer is done with
// round k-2, the previous use of that slot.
//
// A rank writes into its own slot with plain or streaming (non-temporal)
// stores, as Setup::stores and its WriteTuner decide (shm_segment.hpp):
// where writing a line that a peer still caches is slow (some VM core
// placements: 5-10x), streaming stores avoid it; elsewhere plain stores let
// peers read from this core's cache.
//
// Every rank ends with bitwise identical results (each slice is reduced by
// one rank, in a fixed order, whichever stores it used). AVG is SUM then a
// division by the world size in the last reduction step (integers
// truncate).
//
// Header-only, torch-free, Linux only (see shm_segment.hpp).
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/collective/reduce_kernels.hpp"
#include "distopt/sdk/transport/shm_segment.hpp"

namespace distopt::sdk::shm {

/// What Collectives::create needs.
struct Setup {
  bool enabled = true;  ///< false: take part in the agreement, but vote for the network path
  int rank = 0;
  int world_size = 1;
  dopt_store* store = nullptr;           ///< the job's rendezvous store
  std::string scope;                     ///< store key prefix (named as the C ABI's field)
  size_t segment_bytes = 1 << 20;        ///< per rank: header page + two slots (>= 64 KiB sensible)
  double timeout_s = 60;                 ///< for each store read of the handshake, seconds
  std::string component = "shm";         ///< log prefix ("tcp", "ucx")
  std::string fallback = "the network";  ///< named in the log when shm is not used ("TCP")
  Stores stores = Stores::automatic;     ///< how this rank writes into its segment (WriteTuner)
};

/// How a collective ended.
struct Result {
  dopt_status status = DOPT_OK;  ///< DOPT_OK, _COMM, _TIMEOUT or _ABORTED
  std::string why;  ///< on failure: names the peer ("timed out waiting for rank 1 (shared memory)")
  int peer = -1;    ///< on DOPT_ERR_COMM: the rank that left or failed
  uint64_t bytes_sent = 0, bytes_received = 0;  ///< bytes handed to / read from peers
};

/// The shared-memory collectives of one communicator. Not thread-safe: one
/// collective at a time, on the thread that runs it (the communicator's
/// progress thread, or the caller of a calling-thread allreduce), to
/// completion, failure or ctx.deadline; announce() and peers_arrived() only
/// while none runs. Every
/// rank must call them in the same order with matching arguments. Counts
/// are elements of `dt`; arguments are validated by the caller. After a
/// failure the object must not be used for collectives again (the ranks'
/// round counters no longer agree); the output buffer is then undefined.
class Collectives {
 public:
  /// Collective, through the store (keys <prefix>/shm/{host,name,mapped}/<rank>):
  /// every rank publishes its host id (host_id(), or "off" when
  /// !s.enabled); if all match, each creates its segment, maps every
  /// peer's, and says whether all of that worked; then the names are
  /// unlinked. Returns nullptr on every rank alike (use the network path)
  /// unless ALL ranks mapped all segments. Throws std::runtime_error if
  /// the store handshake itself fails (a peer did not publish within
  /// timeout_s) or the segment is too small for the world size.
  static std::unique_ptr<Collectives> create(const Setup& s);

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  /// Bytes streamed per round (per rank).
  size_t slot_bytes() const { return slot_bytes_; }
  /// Arrival for an allreduce on the calling thread (see
  /// p2p::ShellSetup::inline_shm_bytes), any thread while no collective
  /// runs: announce(bytes) says that this rank's caller is at the next
  /// collective, an allreduce of `bytes`; peers_arrived(bytes) whether every
  /// peer announced the same. A hint only: nobody waits on it without a
  /// bound, so it cannot deadlock; a peer at another size is left to the
  /// progress thread, where a stalled wait names the mismatch.
  void announce(uint64_t bytes) const {
    Header* h = hdr(rank_);
    h->arrived_bytes.store(bytes, std::memory_order_relaxed);
    h->arrived.store(round_ + 1, std::memory_order_release);
  }
  bool peers_arrived(uint64_t bytes) const {
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      const Header* h = hdr(p);
      if (h->arrived.load(std::memory_order_acquire) != round_ + 1 ||
          h->arrived_bytes.load(std::memory_order_relaxed) != bytes)
        return false;
    }
    return true;
  }

  /// recv[i] = op over ranks of send[i], i < count; send may equal recv.
  /// From 3 ranks, up to kOnePhaseBytes (and one slot) in one phase: every
  /// rank reduces the whole tensor from every rank's slot, in rank order.
  Result allreduce(const char* send, char* recv, size_t count, DType dt, dopt_reduce_op op,
                   const WaitCtx& ctx);
  /// Largest allreduce (bytes) run in one phase. Two phases (reduce a 1/W
  /// slice, then gather the others' slices) move fewer bytes but wait
  /// twice; below this size the second wait costs more than reading W
  /// slots (a context switch where ranks outnumber cores). Measured on 2
  /// cores at 4-16 KiB (BENCHMARKS.md): 4 ranks, whose runs fall into a
  /// slow and a fast mode either way, 1.15-1.25x (slow) and 1.55-1.8x
  /// (fast); 2 ranks 0.7-0.8x, so 2 ranks keep two phases.
  static constexpr size_t kOnePhaseBytes = 16 << 10;
  /// send holds world_size blocks of `count` elements; recv (count
  /// elements, not overlapping send) gets this rank's block, reduced.
  Result reduce_scatter(const char* send, char* recv, size_t count, DType dt, dopt_reduce_op op,
                        const WaitCtx& ctx);
  /// recv gets every rank's `bytes` of send, in rank order; send may be
  /// this rank's block of recv.
  Result allgather(const char* send, char* recv, size_t bytes, const WaitCtx& ctx);
  /// Every rank's buf gets root's `bytes`.
  Result broadcast(char* buf, size_t bytes, int root, const WaitCtx& ctx);

 private:
  Collectives(int rank, int world, size_t segment_bytes, std::vector<Segment> segs, Stores stores);
  char* slot(int peer, uint64_t round) const {
    return segs_[peer].slot(static_cast<int>(round & 1), slot_bytes_);
  }
  Header* hdr(int peer) const { return segs_[peer].header(); }
  /// The WriteTuner for copies into this rank's slots in an operation of
  /// `bytes` (its whole tensor): one per power of two from 64 KiB, as
  /// whether streaming stores pay depends on how much stays in cache.
  WriteTuner& tuner(size_t bytes) {
    size_t c = 0;
    while (c + 1 < kTuners && (WriteTuner::kMinBytes << (c + 1)) <= bytes) ++c;
    return tuners_[c];
  }
  /// Start a collective at round round_ + 1: publish its signature (Header::op).
  void begin(const char* kind, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the arguments
    for (uint64_t v :
         {static_cast<uint64_t>(kind[0]) << 8 | static_cast<uint64_t>(kind[3]), a, b, c})
      for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    op_first_ = round_ + 1;
    op_word_ = op_first_ << 24 | (h & 0xffffff);
    op_kind_ = kind;
    hdr(rank_)->op.store(op_word_, std::memory_order_release);
  }
  /// After peer's ready reached round `r` of this collective: does the peer
  /// run the same one? (It may have moved on past r: then it did.)
  bool same_collective(int peer, uint64_t r, Result* res) const {
    const uint64_t w = hdr(peer)->op.load(std::memory_order_acquire), first = w >> 24;
    if (first > r || w == op_word_) return true;
    res->status = DOPT_ERR_COMM;
    res->peer = peer;
    res->why = "collective mismatch (shared memory): rank " + std::to_string(peer) +
               " runs another collective than this rank's " + op_kind_ +
               " at the same position (another kind, size, dtype, reduction or root)";
    return false;
  }
  /// Wait for peer's `counter` to reach value; on failure fills res and returns false.
  bool wait(int peer, std::atomic<uint64_t> Header::*counter, uint64_t value, const WaitCtx& ctx,
            Result* res) const;
  /// Before writing this rank's slot for round `r`: every peer is done with round r-2.
  bool wait_slot_free(uint64_t r, const WaitCtx& ctx, Result* res) const;
  void publish_own(std::atomic<uint64_t> Header::*counter, uint64_t value) const {
    Header* h = hdr(rank_);
    publish(h, h->*counter, value);
  }
  /// publish_own(ready, r), and count `bytes` as handed to peers (sdk/base/fault_point.hpp).
  void publish_ready(uint64_t r, size_t bytes, const WaitCtx& ctx) const {
    publish_own(&Header::ready, r);
    if (ctx.fault) ctx.fault->sent(bytes);
  }

  int rank_, world_;
  WaitPolicy policy_;  ///< oversubscribed() when the ranks outnumber this process's CPUs
  size_t slot_bytes_;
  uint64_t round_ = 0;                   ///< last round started
  uint64_t op_first_ = 0, op_word_ = 0;  ///< the running collective (begin())
  const char* op_kind_ = "";
  static constexpr size_t kTuners = 12;  ///< 64 KiB .. 128 MiB and up
  WriteTuner tuners_[kTuners];
  /// Where a streaming allreduce reduces a piece of its slice (in L1), to
  /// copy it to the slot with streaming stores and to recv.
  static constexpr size_t kStageBytes = 16 << 10;
  std::vector<char> stage_ = std::vector<char>(kStageBytes);
  std::vector<Segment> segs_;  ///< segs_[p]: rank p's segment (own included)
};

namespace detail {

// Store helpers for the handshake: values are short strings.
inline void store_put(dopt_store* st, const std::string& key, const std::string& v) {
  if (host()->store_set(st, key.c_str(), v.data(), v.size()) != DOPT_OK)
    throw std::runtime_error("cannot publish '" + key + "' in the store");
}

inline std::string store_fetch(dopt_store* st, const std::string& key, double timeout_s, int peer) {
  std::string buf(512, '\0');
  size_t len = 0;
  dopt_status s = host()->store_get(st, key.c_str(), &buf[0], buf.size(), &len,
                                    static_cast<int64_t>(timeout_s * 1000));
  if (s != DOPT_OK || len > buf.size())
    throw std::runtime_error("rank " + std::to_string(peer) + " did not publish '" + key +
                             "' (shared-memory setup)");
  buf.resize(len);
  return buf;
}

}  // namespace detail

inline std::unique_ptr<Collectives> Collectives::create(const Setup& s) {
  const int n = s.world_size, me = s.rank;
  const std::string base = s.scope + "/shm/";
  const char* component = s.component.c_str();
  auto key = [&](const char* what, int r) { return base + what + "/" + std::to_string(r); };

  // 1. Same host (and same /dev/shm), and shm enabled everywhere? Every rank
  // decides from the same published data, so they all agree even when their
  // options differ.
  const std::string host = s.enabled ? host_id() : std::string("off");
  std::vector<std::string> hosts(static_cast<size_t>(n));
  detail::store_put(s.store, key("host", me), host);
  for (int p = 0; p < n; ++p)
    hosts[p] = p == me ? host : detail::store_fetch(s.store, key("host", p), s.timeout_s, p);
  for (int p = 0; p < n; ++p) {
    if (hosts[p] != "off" && hosts[p] == hosts[0]) continue;
    if (me == 0)
      log_info(component, "collectives over " + s.fallback + ": " +
                              (hosts[p] == "off" ? "shm is turned off on rank "
                                                 : "another host than rank 0's: rank ") +
                              std::to_string(p));
    return nullptr;
  }

  // 2. Create this rank's segment and publish its name ("" = could not).
  std::vector<Segment> segs(static_cast<size_t>(n));
  std::string why;
  try {
    segs[me] = Segment::create(s.segment_bytes);
  } catch (const std::exception& e) {
    why = e.what();
  }
  detail::store_put(s.store, key("name", me), why.empty() ? segs[me].name() : std::string());

  // 3. Map every peer's; publish whether all of it worked.
  bool ok = why.empty();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::string name = detail::store_fetch(s.store, key("name", p), s.timeout_s, p);
    if (name.empty()) {
      ok = false;
      continue;
    }
    if (!ok) continue;
    try {
      segs[p] = Segment::open(name, s.segment_bytes);
    } catch (const std::exception& e) {
      why = e.what();
      ok = false;
    }
  }
  detail::store_put(s.store, key("mapped", me), ok ? "1" : "0");

  // 4. Once every peer answered, nobody needs the names any more: unlink
  // ours, so a crash from here on leaves nothing in /dev/shm.
  bool all = ok;
  for (int p = 0; p < n; ++p)
    if (p != me && detail::store_fetch(s.store, key("mapped", p), s.timeout_s, p) != "1")
      all = false;
  segs[me].unlink();
  if (!why.empty())
    log_warn(component, "rank " + std::to_string(me) + ": shared memory unavailable: " + why);
  if (!all) {
    if (me == 0)
      log_info(component,
               "collectives over " + s.fallback + ": a rank could not set up shared memory");
    return nullptr;
  }
  std::unique_ptr<Collectives> t(
      new Collectives(me, n, s.segment_bytes, std::move(segs), s.stores));
  if (me == 0)
    log_info(component, "collectives over shared memory: " + std::to_string(n) +
                            " ranks on one host, 2 slots of " +
                            std::to_string(t->slot_bytes_ >> 10) + " KiB per rank");
  return t;
}

inline Collectives::Collectives(int rank, int world, size_t segment_bytes,
                                std::vector<Segment> segs, Stores stores)
    : rank_(rank), world_(world), segs_(std::move(segs)) {
  for (WriteTuner& t : tuners_) t = WriteTuner(stores);
  // Cache-line multiple: slices of neighbouring ranks start on their own
  // lines only by chance, but slot starts always do.
  slot_bytes_ = segment_bytes > kDataOffset ? (segment_bytes - kDataOffset) / 2 / 64 * 64 : 0;
  if (slot_bytes_ < static_cast<size_t>(world) * 8)
    throw std::runtime_error("shared-memory segment too small");
  // Every rank of these collectives is on this host: more of them than the
  // CPUs this process may run on means they take turns on cores.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && world > CPU_COUNT(&cpus))
    policy_ = WaitPolicy::oversubscribed();
}

inline bool Collectives::wait(int peer, std::atomic<uint64_t> Header::*counter, uint64_t value,
                              const WaitCtx& ctx, Result* res) const {
  Header* h = hdr(peer);
  WaitError err;
  const dopt_status st = shm::wait(h, h->*counter, value, ctx,
                                   ctx.peer_left ? &ctx.peer_left[peer] : nullptr, &err, policy_);
  if (st == DOPT_OK) return counter != &Header::ready || same_collective(peer, value, res);
  res->status = st;
  if (st == DOPT_ERR_COMM) {
    res->peer = err.peer >= 0 ? err.peer : peer;
    res->why = !err.why.empty() ? err.why
                                : "rank " + std::to_string(res->peer) + " closed the communicator";
  } else {
    res->why = st == DOPT_ERR_TIMEOUT
                   ? "timed out waiting for rank " + std::to_string(peer) + " (shared memory)"
                   : "communicator failed";
  }
  return false;
}

inline bool Collectives::wait_slot_free(uint64_t r, const WaitCtx& ctx, Result* res) const {
  if (r <= 2) return true;
  for (int p = 0; p < world_; ++p)
    if (p != rank_ && !wait(p, &Header::done, r - 2, ctx, res)) return false;
  return true;
}

inline Result Collectives::allreduce(const char* send, char* recv, size_t count, DType dt,
                                     dopt_reduce_op op, const WaitCtx& ctx) {
  const int n = world_, me = rank_;
  const size_t esz = dtype_size(dt), per_round = slot_bytes_ / esz;
  const dopt_reduce_op rop = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
  const int div = op == DOPT_REDUCE_AVG ? n : 1;
  const size_t bytes = count * esz;
  begin("allreduce", count, static_cast<uint64_t>(dt), static_cast<uint64_t>(op));
  if (n > 2 && count > 0 && bytes <= kOnePhaseBytes && bytes <= slot_bytes_) {
    // One phase: the whole input into this rank's slot; once every peer's
    // is in theirs, reduce slot 0 op slot 1 op ... into recv. Every rank
    // sums in the same order, so all end bitwise equal; this rank's own
    // input is read from its slot too, as recv may be send.
    const uint64_t r = ++round_;
    Result res;
    if (!wait_slot_free(r, ctx, &res)) return res;
    std::memcpy(slot(me, r), send, bytes);
    publish_ready(r, bytes, ctx);
    res.bytes_sent += bytes;
    for (int k = 1; k < n; ++k)
      if (!wait((me + k) % n, &Header::ready, r, ctx, &res)) return res;
    for (int p = 1; p < n; ++p)
      reduce(dt, rop, recv, p == 1 ? slot(0, r) : recv, slot(p, r), count, p == n - 1 ? div : 1);
    publish_own(&Header::done, r);
    res.bytes_received += (n - 1) * bytes;
    return res;
  }
  const size_t rounds = (count + per_round - 1) / per_round;
  const uint64_t first = round_ + 1;
  round_ += rounds;
  Result res;
  // Round i covers elements [i * per_round, +m); slice p of it is balanced
  // to within one element.
  auto elems = [&](size_t i) { return std::min(per_round, count - i * per_round); };
  auto off = [&](size_t m, int p) { return (m / n * p + std::min<size_t>(p, m % n)) * esz; };
  // Software-pipelined: iteration i fills round i, gathers round i-1 (whose
  // slices peers reduced meanwhile), then reduces its slice of round i. A
  // rank then rarely blocks more than once per round, which matters when
  // ranks outnumber cores and every block is a context switch.
  //
  // Bytes: a rank's own slice never goes through its slot on the way in
  // (the reduction reads it from `send`) nor on the way out (the reduction's
  // result is copied to `recv` while it is still in cache), so per byte of
  // the tensor a rank copies (W-1)/W in, reduces 1/W and copies (W-1)/W out
  // instead of 1, 1/W and 1.
  auto gather = [&](size_t i) {
    const uint64_t r = first + i;
    const size_t m = elems(i);
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &Header::reduced, r, ctx, &res)) return false;
      const size_t plo = off(m, p), plen = off(m, p + 1) - plo;
      if (plen) std::memcpy(recv + i * per_round * esz + plo, slot(p, r) + plo, plen);
    }
    publish_own(&Header::done, r);
    res.bytes_received += m * esz;
    return true;
  };
  for (size_t i = 0; i < rounds; ++i) {
    const uint64_t r = first + i;
    const size_t m = elems(i);
    if (!wait_slot_free(r, ctx, &res)) return res;
    char* mine = slot(me, r);
    const char* in = send + i * per_round * esz;
    const size_t lo = off(m, me), len = off(m, me + 1) - lo;
    // The peers' slices of this rank's input (around its own).
    WriteTuner& wt = tuner(bytes);
    if (lo) wt.copy(mine, in, lo);
    if (lo + len < m * esz) wt.copy(mine + lo + len, in + lo + len, m * esz - lo - len);
    const bool streaming = wt.streaming();
    publish_ready(r, m * esz, ctx);
    res.bytes_sent += m * esz;
    if (i > 0 && !gather(i - 1)) return res;
    // Reduce this rank's slice into its own slot, where peers read it after
    // `reduced` (they read only their own slices of it before).
    char* out = recv + i * per_round * esz + lo;
    if (streaming && n > 1) {
      // As the copy in: the slice goes to the slot with streaming stores,
      // through a stage in L1 that also feeds recv. Same order of
      // operands, so the same bits as below.
      for (int k = 1; k < n; ++k)
        if (!wait((me + k) % n, &Header::ready, r, ctx, &res)) return res;
      char* stage = stage_.data();
      for (size_t c = 0; c < len; c += kStageBytes) {
        const size_t cl = std::min(kStageBytes, len - c);
        for (int k = 1; k < n; ++k)
          reduce(dt, rop, stage, k == 1 ? in + lo + c : stage, slot((me + k) % n, r) + lo + c,
                 cl / esz, k == n - 1 ? div : 1);
        stream_copy(mine + lo + c, stage, cl);
        std::memcpy(out + c, stage, cl);  // `in` + lo + c is read for good: send may be recv
      }
      publish_own(&Header::reduced, r);
      continue;
    }
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &Header::ready, r, ctx, &res)) return res;
      if (len)
        reduce(dt, rop, mine + lo, k == 1 ? in + lo : mine + lo, slot(p, r) + lo, len / esz,
               k == n - 1 ? div : 1);
    }
    if (n == 1 && len) std::memcpy(mine + lo, in + lo, len);
    publish_own(&Header::reduced, r);
    // `in` is read for good now: the output may overwrite it (send == recv).
    if (len) std::memcpy(out, mine + lo, len);
  }
  if (rounds > 0) gather(rounds - 1);
  return res;
}

inline Result Collectives::reduce_scatter(const char* send, char* recv, size_t count, DType dt,
                                          dopt_reduce_op op, const WaitCtx& ctx) {
  const int n = world_, me = rank_;
  const size_t esz = dtype_size(dt);
  // A round carries the same sub-range of every block: n sub-chunks per slot.
  const size_t per_round = std::max<size_t>(1, slot_bytes_ / esz / static_cast<size_t>(n));
  const dopt_reduce_op rop = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
  const int div = op == DOPT_REDUCE_AVG ? n : 1;
  begin("reduce_scatter", count, static_cast<uint64_t>(dt), static_cast<uint64_t>(op));
  Result res;
  for (size_t b0 = 0; b0 < count; b0 += per_round) {
    const size_t m = std::min(per_round, count - b0), mb = m * esz;
    const uint64_t r = ++round_;
    if (!wait_slot_free(r, ctx, &res)) return res;
    char* mine = slot(me, r);
    // Peers need the blocks they own; this rank's own block is read from send.
    WriteTuner& wt = tuner(count * esz * static_cast<size_t>(n));
    for (int q = 0; q < n; ++q)
      if (q != me) wt.copy(mine + q * mb, send + (q * count + b0) * esz, mb);
    publish_ready(r, mb * static_cast<size_t>(n - 1), ctx);
    char* dst = recv + b0 * esz;
    const char* own = send + (me * count + b0) * esz;
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &Header::ready, r, ctx, &res)) return res;
      reduce(dt, rop, dst, k == 1 ? own : dst, slot(p, r) + me * mb, m, k == n - 1 ? div : 1);
    }
    publish_own(&Header::done, r);
    res.bytes_sent += mb * static_cast<size_t>(n - 1);
    res.bytes_received += mb * static_cast<size_t>(n - 1);
  }
  return res;
}

inline Result Collectives::allgather(const char* send, char* recv, size_t bytes,
                                     const WaitCtx& ctx) {
  const int n = world_, me = rank_;
  begin("allgather", bytes, 0, 0);
  Result res;
  // This rank's block first (send may alias it), then stream from there.
  char* own = recv + me * bytes;
  if (own != send) std::memmove(own, send, bytes);
  for (size_t b0 = 0; b0 < bytes; b0 += slot_bytes_) {
    const size_t m = std::min(slot_bytes_, bytes - b0);
    const uint64_t r = ++round_;
    if (!wait_slot_free(r, ctx, &res)) return res;
    tuner(bytes * static_cast<size_t>(n)).copy(slot(me, r), own + b0, m);
    publish_ready(r, m, ctx);
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &Header::ready, r, ctx, &res)) return res;
      std::memcpy(recv + p * bytes + b0, slot(p, r), m);
    }
    publish_own(&Header::done, r);
    res.bytes_sent += m;
    res.bytes_received += m * static_cast<size_t>(n - 1);
  }
  return res;
}

inline Result Collectives::broadcast(char* buf, size_t bytes, int root, const WaitCtx& ctx) {
  const int me = rank_;
  begin("broadcast", bytes, static_cast<uint64_t>(root), 0);
  Result res;
  for (size_t b0 = 0; b0 < bytes; b0 += slot_bytes_) {
    const size_t m = std::min(slot_bytes_, bytes - b0);
    const uint64_t r = ++round_;
    if (me == root) {
      if (!wait_slot_free(r, ctx, &res)) return res;
      tuner(bytes).copy(slot(me, r), buf + b0, m);
      publish_ready(r, m, ctx);
      res.bytes_sent += m;
    } else {
      if (!wait(root, &Header::ready, r, ctx, &res)) return res;
      std::memcpy(buf + b0, slot(root, r), m);
      res.bytes_received += m;
    }
    // Every rank, the root too: the next round's writer (any root) waits on it.
    publish_own(&Header::done, r);
  }
  return res;
}

}  // namespace distopt::sdk::shm
