#include "shm_collectives.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "distopt/sdk/host.hpp"

namespace distopt::plugins::tcp {
namespace {

// Store helpers for the handshake: values are short strings.
void store_put(dopt_store* st, const std::string& key, const std::string& v) {
  if (sdk::host()->store_set(st, key.c_str(), v.data(), v.size()) != DOPT_OK)
    throw std::runtime_error("cannot publish '" + key + "' in the store");
}

std::string store_fetch(dopt_store* st, const std::string& key, double timeout_s, int peer) {
  std::string buf(512, '\0');
  size_t len = 0;
  dopt_status s = sdk::host()->store_get(st, key.c_str(), &buf[0], buf.size(), &len,
                                         static_cast<int64_t>(timeout_s * 1000));
  if (s != DOPT_OK || len > buf.size())
    throw std::runtime_error("rank " + std::to_string(peer) + " did not publish '" + key +
                             "' (shared-memory setup)");
  buf.resize(len);
  return buf;
}

}  // namespace

std::unique_ptr<ShmTransport> ShmTransport::create(const ShmSetup& s) {
  const int n = s.world_size, me = s.rank;
  const std::string base = s.scope + "/shm/";
  auto key = [&](const char* what, int r) { return base + what + "/" + std::to_string(r); };

  // 1. Same host (and same /dev/shm), and shm enabled everywhere? Every rank
  // decides from the same published data, so they all agree even when their
  // options differ.
  const std::string host = s.enabled ? shm_host_id() : std::string("off");
  std::vector<std::string> hosts(static_cast<size_t>(n));
  store_put(s.store, key("host", me), host);
  for (int p = 0; p < n; ++p)
    hosts[p] = p == me ? host : store_fetch(s.store, key("host", p), s.timeout_s, p);
  for (int p = 0; p < n; ++p) {
    if (hosts[p] != "off" && hosts[p] == hosts[0]) continue;
    if (me == 0)
      sdk::log_info("tcp",
                    "collectives over TCP: " +
                        std::string(hosts[p] == "off" ? "shm is turned off on rank "
                                                      : "another host than rank 0's: rank ") +
                        std::to_string(p));
    return nullptr;
  }

  // 2. Create this rank's segment and publish its name ("" = could not).
  std::vector<ShmSegment> segs(static_cast<size_t>(n));
  std::string why;
  try {
    segs[me] = ShmSegment::create(s.segment_bytes);
  } catch (const std::exception& e) {
    why = e.what();
  }
  store_put(s.store, key("name", me), why.empty() ? segs[me].name() : std::string());

  // 3. Map every peer's; publish whether all of it worked.
  bool ok = why.empty();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::string name = store_fetch(s.store, key("name", p), s.timeout_s, p);
    if (name.empty()) {
      ok = false;
      continue;
    }
    if (!ok) continue;
    try {
      segs[p] = ShmSegment::open(name, s.segment_bytes);
    } catch (const std::exception& e) {
      why = e.what();
      ok = false;
    }
  }
  store_put(s.store, key("mapped", me), ok ? "1" : "0");

  // 4. Once every peer answered, nobody needs the names any more: unlink
  // ours, so a crash from here on leaves nothing in /dev/shm.
  bool all = ok;
  for (int p = 0; p < n; ++p)
    if (p != me && store_fetch(s.store, key("mapped", p), s.timeout_s, p) != "1") all = false;
  segs[me].unlink();
  if (!why.empty())
    sdk::log_warn("tcp", "rank " + std::to_string(me) + ": shared memory unavailable: " + why);
  if (!all) {
    if (me == 0)
      sdk::log_info("tcp", "collectives over TCP: a rank could not set up shared memory");
    return nullptr;
  }
  std::unique_ptr<ShmTransport> t(new ShmTransport(me, n, s.segment_bytes, std::move(segs)));
  if (me == 0)
    sdk::log_info("tcp", "collectives over shared memory: " + std::to_string(n) +
                             " ranks on one host, 2 slots of " +
                             std::to_string(t->slot_bytes_ >> 10) + " KiB per rank");
  return t;
}

ShmTransport::ShmTransport(int rank, int world, size_t segment_bytes, std::vector<ShmSegment> segs)
    : rank_(rank), world_(world), segs_(std::move(segs)) {
  // Cache-line multiple: slices of neighbouring ranks start on their own lines
  // only by chance, but slot starts always do.
  slot_bytes_ = (segment_bytes - kShmDataOffset) / 2 / 64 * 64;
  if (slot_bytes_ < static_cast<size_t>(world) * 8)
    throw std::runtime_error("shared-memory segment too small");
}

bool ShmTransport::wait(int peer, std::atomic<uint64_t> ShmHeader::*counter, uint64_t value,
                        const ShmWaitCtx& ctx, RingResult* res) const {
  ShmHeader* h = hdr(peer);
  dopt_status st =
      shm_wait(h, h->*counter, value, ctx, ctx.peer_left ? &ctx.peer_left[peer] : nullptr);
  if (st == DOPT_OK) return true;
  res->status = st;
  if (st == DOPT_ERR_COMM) res->peer = peer;  // the failure path names why it left
  res->why = st == DOPT_ERR_TIMEOUT
                 ? "timed out waiting for rank " + std::to_string(peer) + " (shared memory)"
             : st == DOPT_ERR_COMM ? "rank " + std::to_string(peer) + " closed the communicator"
                                   : "communicator failed";
  return false;
}

bool ShmTransport::wait_slot_free(uint64_t r, const ShmWaitCtx& ctx, RingResult* res) const {
  if (r <= 2) return true;
  for (int p = 0; p < world_; ++p)
    if (p != rank_ && !wait(p, &ShmHeader::done, r - 2, ctx, res)) return false;
  return true;
}

void ShmTransport::publish(std::atomic<uint64_t> ShmHeader::*counter, uint64_t value) const {
  ShmHeader* h = hdr(rank_);
  shm_publish(h, h->*counter, value);
}

void ShmTransport::publish_ready(uint64_t r, size_t bytes, const ShmWaitCtx& ctx) const {
  publish(&ShmHeader::ready, r);
  if (ctx.fault) ctx.fault->sent(bytes);
}

RingResult ShmTransport::allreduce(const char* send, char* recv, size_t count, DType dt,
                                   dopt_reduce_op op, const ShmWaitCtx& ctx) {
  const int n = world_, me = rank_;
  const size_t esz = dtype_size(dt), per_round = slot_bytes_ / esz;
  const dopt_reduce_op rop = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
  const int div = op == DOPT_REDUCE_AVG ? n : 1;
  const size_t rounds = (count + per_round - 1) / per_round;
  const uint64_t first = round_ + 1;
  round_ += rounds;
  RingResult res;
  // Round i covers elements [i * per_round, +m); slice p of it is balanced to
  // within one element.
  auto elems = [&](size_t i) { return std::min(per_round, count - i * per_round); };
  auto off = [&](size_t m, int p) { return (m / n * p + std::min<size_t>(p, m % n)) * esz; };
  // Software-pipelined: iteration i fills round i, gathers round i-1 (whose
  // slices peers reduced meanwhile), then reduces its slice of round i. A
  // rank then rarely blocks more than once per round, which matters when
  // ranks outnumber cores and every block is a context switch.
  auto gather = [&](size_t i) {
    const uint64_t r = first + i;
    const size_t m = elems(i);
    for (int k = 0; k < n; ++k) {  // this rank's slice first: it is ready
      const int p = (me + k) % n;
      if (p != me && !wait(p, &ShmHeader::reduced, r, ctx, &res)) return false;
      const size_t plo = off(m, p), plen = off(m, p + 1) - plo;
      if (plen) std::memcpy(recv + i * per_round * esz + plo, slot(p, r) + plo, plen);
    }
    publish(&ShmHeader::done, r);
    res.bytes_received += m * esz;
    return true;
  };
  for (size_t i = 0; i < rounds; ++i) {
    const uint64_t r = first + i;
    const size_t m = elems(i);
    if (!wait_slot_free(r, ctx, &res)) return res;
    char* mine = slot(me, r);
    std::memcpy(mine, send + i * per_round * esz, m * esz);
    publish_ready(r, m * esz, ctx);
    res.bytes_sent += m * esz;
    if (i > 0 && !gather(i - 1)) return res;
    // Reduce this rank's slice in place in its own slot (peers read only
    // their own slices of it until `reduced`).
    const size_t lo = off(m, me), len = off(m, me + 1) - lo;
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &ShmHeader::ready, r, ctx, &res)) return res;
      if (len)
        reduce(dt, rop, mine + lo, mine + lo, slot(p, r) + lo, len / esz, k == n - 1 ? div : 1);
    }
    publish(&ShmHeader::reduced, r);
  }
  if (rounds > 0) gather(rounds - 1);
  return res;
}

RingResult ShmTransport::reduce_scatter(const char* send, char* recv, size_t count, DType dt,
                                        dopt_reduce_op op, const ShmWaitCtx& ctx) {
  const int n = world_, me = rank_;
  const size_t esz = dtype_size(dt);
  // A round carries the same sub-range of every block: n sub-chunks per slot.
  const size_t per_round = std::max<size_t>(1, slot_bytes_ / esz / static_cast<size_t>(n));
  const dopt_reduce_op rop = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
  const int div = op == DOPT_REDUCE_AVG ? n : 1;
  RingResult res;
  for (size_t b0 = 0; b0 < count; b0 += per_round) {
    const size_t m = std::min(per_round, count - b0), mb = m * esz;
    const uint64_t r = ++round_;
    if (!wait_slot_free(r, ctx, &res)) return res;
    char* mine = slot(me, r);
    // Peers need the blocks they own; this rank's own block is read from send.
    for (int q = 0; q < n; ++q)
      if (q != me) std::memcpy(mine + q * mb, send + (q * count + b0) * esz, mb);
    publish_ready(r, mb * static_cast<size_t>(n - 1), ctx);
    char* dst = recv + b0 * esz;
    const char* own = send + (me * count + b0) * esz;
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &ShmHeader::ready, r, ctx, &res)) return res;
      reduce(dt, rop, dst, k == 1 ? own : dst, slot(p, r) + me * mb, m, k == n - 1 ? div : 1);
    }
    publish(&ShmHeader::done, r);
    res.bytes_sent += mb * static_cast<size_t>(n - 1);
    res.bytes_received += mb * static_cast<size_t>(n - 1);
  }
  return res;
}

RingResult ShmTransport::allgather(const char* send, char* recv, size_t bytes,
                                   const ShmWaitCtx& ctx) {
  const int n = world_, me = rank_;
  RingResult res;
  // This rank's block first (send may alias it), then stream from there.
  char* own = recv + me * bytes;
  if (own != send) std::memmove(own, send, bytes);
  for (size_t b0 = 0; b0 < bytes; b0 += slot_bytes_) {
    const size_t m = std::min(slot_bytes_, bytes - b0);
    const uint64_t r = ++round_;
    if (!wait_slot_free(r, ctx, &res)) return res;
    std::memcpy(slot(me, r), own + b0, m);
    publish_ready(r, m, ctx);
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!wait(p, &ShmHeader::ready, r, ctx, &res)) return res;
      std::memcpy(recv + p * bytes + b0, slot(p, r), m);
    }
    publish(&ShmHeader::done, r);
    res.bytes_sent += m;
    res.bytes_received += m * static_cast<size_t>(n - 1);
  }
  return res;
}

RingResult ShmTransport::broadcast(char* buf, size_t bytes, int root, const ShmWaitCtx& ctx) {
  const int me = rank_;
  RingResult res;
  for (size_t b0 = 0; b0 < bytes; b0 += slot_bytes_) {
    const size_t m = std::min(slot_bytes_, bytes - b0);
    const uint64_t r = ++round_;
    if (me == root) {
      if (!wait_slot_free(r, ctx, &res)) return res;
      std::memcpy(slot(me, r), buf + b0, m);
      publish_ready(r, m, ctx);
      res.bytes_sent += m;
    } else {
      if (!wait(root, &ShmHeader::ready, r, ctx, &res)) return res;
      std::memcpy(buf + b0, slot(root, r), m);
      res.bytes_received += m;
    }
    // Every rank, the root too: the next round's writer (any root) waits on it.
    publish(&ShmHeader::done, r);
  }
  return res;
}

}  // namespace distopt::plugins::tcp
