// distopt's collective algorithms over a p2p::Transport (p2p_transport.hpp),
// shared by every communicator that moves host memory through tagged
// point-to-point messages. Header-only, torch-free.
//
// Choice by size, as UCC does (latency-bound below a threshold,
// bandwidth-bound above; UCC switches allreduce from recursive k-nomial to
// SRA/ring at a few KiB to a few tens of KiB):
//   allreduce, bytes <= small_bytes (default 64 KiB): recursive doubling
//     when the world size is a power of two, else a direct exchange (every
//     rank sends its vector to every other and reduces them in rank order):
//     log2(n) or 1 message latencies instead of the ring's 2(n-1).
//   allreduce above that: ring reduce-scatter then ring allgather
//     (Patarasuk & Yuan 2009), each block cut into segments of
//     segment_bytes (default 1 MiB) that are reduced and forwarded as soon
//     as they arrive, so the ring steps pipeline. Reduce steps receive into
//     a window of recv_depth segment slots, reused as the segments are
//     reduced, so the incoming data is still in cache when it is reduced
//     (a whole block of scratch would stream through memory).
//   reduce_scatter / allgather: the two halves of that ring.
//   broadcast: root sends to every rank below small_bytes; above, a chain
//     from the root, pipelined in segments.
//   barrier: dissemination (Hensgen, Finkel & Manber 1988), ceil(log2 n)
//     rounds of 1-byte messages.
// Every rank ends with bitwise identical results (each block is reduced by
// one chain, or in rank order). AVG is SUM followed by a division by the
// world size in the last reduction step (integers truncate).
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "distopt/sdk/collective/reduce_kernels.hpp"
#include "distopt/sdk/transport/p2p_transport.hpp"

namespace distopt::sdk::p2p {

/// Tuning of Collectives (see the file comment).
struct CollectiveOptions {
  size_t small_bytes = 64 << 10;   ///< allreduce/broadcast latency path up to this size
  size_t segment_bytes = 1 << 20;  ///< pipeline grain of the ring and chain
  size_t recv_depth = 4;           ///< segments of a reduce step in flight (scratch slots)
};

/// The collectives of one communicator. Every rank must call them in the
/// same order with matching arguments (like MPI). Not thread-safe: call
/// from the thread that owns the transport. Each call throws what
/// Transport::wait_all throws (COMM naming a peer, TIMEOUT, ABORTED); the
/// output buffer is then undefined.
class Collectives {
 public:
  explicit Collectives(Transport& t, CollectiveOptions o = {}) : t_(t), o_(o) {
    if (o_.segment_bytes < 8) o_.segment_bytes = 8;
    if (o_.recv_depth < 1) o_.recv_depth = 1;
  }

  /// recv[i] = op over ranks of send[i], i < count; send may equal recv.
  void allreduce(const void* send, void* recv, size_t count, DType dt, dopt_reduce_op op,
                 Clock::time_point deadline) {
    const uint64_t seq = seq_++;
    const int n = t_.world_size();
    const size_t esz = dtype_size(dt);
    const int div = op == DOPT_REDUCE_AVG ? n : 1;
    const dopt_reduce_op rop = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
    if (n == 1 || count == 0 || count * esz <= o_.small_bytes) {
      if (send != recv) std::memcpy(recv, send, count * esz);
    }
    if (n == 1 || count == 0) {
      if (div > 1) divide(dt, recv, recv, count, div);
      return;
    }
    if (count * esz <= o_.small_bytes) {
      if ((n & (n - 1)) == 0)
        recursive_doubling(static_cast<char*>(recv), count, dt, rop, div, seq, deadline);
      else
        direct_exchange(static_cast<char*>(recv), count, dt, rop, div, seq, deadline);
      return;
    }
    // The ring reads this rank's operands from send: no copy into recv first.
    Ring ring{static_cast<char*>(recv), count, dt, rop, div};
    ring.src = static_cast<const char*>(send);
    run_ring(ring, 0, 2 * (n - 1), seq, deadline);
  }

  /// recv (recv_count elements) = op over ranks of block `rank` of send
  /// (world_size * recv_count elements); send and recv must not overlap.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dt, dopt_reduce_op op,
                      Clock::time_point deadline) {
    const uint64_t seq = seq_++;
    const int n = t_.world_size();
    const size_t esz = dtype_size(dt);
    const int div = op == DOPT_REDUCE_AVG ? n : 1;
    if (n == 1 || recv_count == 0) {
      divide(dt, recv, send, recv_count, div);
      return;
    }
    work_.resize(recv_count * n * esz);
    Ring ring{work_.data(), recv_count * n, dt, op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op, div};
    ring.src = static_cast<const char*>(send);
    run_ring(ring, 0, n - 1, seq, deadline);
    std::memcpy(recv, work_.data() + ring.offset(t_.rank()) * esz, recv_count * esz);
  }

  /// recv (world_size * bytes bytes) = the ranks' `send` (bytes each) in rank
  /// order; send may be recv's own block.
  void allgather(const void* send, void* recv, size_t bytes, Clock::time_point deadline) {
    const uint64_t seq = seq_++;
    const int n = t_.world_size();
    char* out = static_cast<char*>(recv);
    if (out + t_.rank() * bytes != send) std::memmove(out + t_.rank() * bytes, send, bytes);
    if (n == 1 || bytes == 0) return;
    Ring ring{out, bytes * n, DType::I32, DOPT_REDUCE_SUM, 1};
    ring.esz = 1;
    run_ring(ring, n - 1, 2 * (n - 1), seq, deadline);
  }

  /// buf (bytes) on every rank = buf on `root`.
  void broadcast(void* buf, size_t bytes, int root, Clock::time_point deadline) {
    const uint64_t seq = seq_++;
    const int n = t_.world_size(), r = t_.rank();
    if (n == 1 || bytes == 0) return;
    char* p = static_cast<char*>(buf);
    const uint64_t tag = Tag::collective(seq, 0);
    std::vector<Handle> hs;
    if (bytes <= o_.small_bytes) {
      if (r == root) {
        for (int q = 0; q < n; ++q)
          if (q != r) hs.push_back(t_.isend(q, tag, p, bytes));
      } else {
        hs.push_back(t_.irecv(root, tag, p, bytes));
      }
      t_.wait_all(hs.data(), hs.size(), deadline);
      return;
    }
    // Chain root -> root+1 -> ... : each segment is forwarded once it arrived.
    const int v = (r - root + n) % n;
    const int prev = (r - 1 + n) % n, next = (r + 1) % n;
    const size_t seg = o_.segment_bytes;
    std::vector<Handle> recvs;
    if (v > 0)
      for (size_t off = 0; off < bytes; off += seg)
        recvs.push_back(t_.irecv(prev, tag, p + off, std::min(seg, bytes - off)));
    size_t j = 0;
    for (size_t off = 0; off < bytes; off += seg, ++j) {
      if (v > 0) wait_one(recvs, j, deadline);
      if (v < n - 1) hs.push_back(t_.isend(next, tag, p + off, std::min(seg, bytes - off)));
    }
    t_.wait_all(hs.data(), hs.size(), deadline);
  }

  /// Returns on every rank only after every rank called it.
  void barrier(Clock::time_point deadline) {
    const uint64_t seq = seq_++;
    const int n = t_.world_size(), r = t_.rank();
    char out = 1, in[64];
    int step = 0;
    for (int k = 1; k < n; k <<= 1, ++step) {
      const uint64_t tag = Tag::collective(seq, step);
      Handle hs[2] = {t_.isend((r + k) % n, tag, &out, 1),
                      t_.irecv((r - k + n) % n, tag, &in[step], 1)};
      t_.wait_all(hs, 2, deadline);
    }
  }

 private:
  /// A vector cut into world_size blocks (the first count % n one longer).
  /// Reduce steps write buf = src (this rank's operand) op incoming; the
  /// first step sends from src, later ones forward from buf.
  struct Ring {
    char* buf;
    size_t count;
    DType dt;
    dopt_reduce_op op;
    int div;
    size_t esz = dtype_size(dt);
    int n = 0;
    const char* src = nullptr;  ///< nullptr: buf
    size_t offset(int b) const {
      const size_t base = count / n, rem = count % n;
      return b * base + std::min<size_t>(b, rem);
    }
    size_t length(int b) const { return count / n + (static_cast<size_t>(b) < count % n); }
  };

  // Wait for handle j of hs (then marked 0 so it is not waited again).
  void wait_one(std::vector<Handle>& hs, size_t j, Clock::time_point deadline) {
    t_.wait_all(&hs[j], 1, deadline);
    hs[j] = 0;
  }
  void wait_live(std::vector<Handle>& hs, Clock::time_point deadline) {
    hs.erase(std::remove(hs.begin(), hs.end(), Handle{0}), hs.end());
    t_.wait_all(hs.data(), hs.size(), deadline);
    hs.clear();
  }

  /// Steps [t0, t1) of the ring over 2(n-1) steps: step t < n-1 reduces,
  /// later ones copy. At step t rank r sends virtual block r-t and receives
  /// r-t-1 (mod n); the block received at t is the one sent at t+1, so each
  /// segment is forwarded as soon as it is reduced. Virtual block v is real
  /// block v-1: after the reduce-scatter half rank r holds real block r.
  /// Copy steps receive in place; reduce steps receive segment j into slot
  /// j % recv_depth of their step's window, and post segment j + recv_depth
  /// once j is reduced (same tag, so posting order keeps the matching).
  void run_ring(Ring& g, int t0, int t1, uint64_t seq, Clock::time_point deadline) {
    const int n = t_.world_size(), r = t_.rank();
    g.n = n;
    if (!g.src) g.src = g.buf;
    const int prev = (r - 1 + n) % n, next = (r + 1) % n;
    const size_t seg_elems = std::max<size_t>(1, o_.segment_bytes / g.esz);
    const size_t depth = o_.recv_depth, slot_bytes = seg_elems * g.esz;
    auto real = [&](int v) { return ((v % n) + 2 * n - 1) % n; };
    auto send_block = [&](int t) { return real(r - t + 2 * n); };
    auto recv_block = [&](int t) { return real(r - t - 1 + 2 * n); };
    auto segments = [&](int b) { return (g.length(b) + seg_elems - 1) / seg_elems; };
    auto slot = [&](int t, size_t j) {
      return scratch_.data() + ((t % 2) * depth + j % depth) * slot_bytes;
    };
    scratch_.resize(2 * depth * slot_bytes);
    std::vector<Handle> sends, recvs[2];
    auto post_recv = [&](int t, size_t j) {
      const int b = recv_block(t);
      const size_t e = j * seg_elems, len = std::min(seg_elems, g.length(b) - e);
      char* dst = t < n - 1 ? slot(t, j) : g.buf + (g.offset(b) + e) * g.esz;
      recvs[t % 2].push_back(t_.irecv(prev, Tag::collective(seq, t), dst, len * g.esz));
    };
    auto post_recvs = [&](int t) {
      const size_t m = segments(recv_block(t));
      for (size_t j = 0; j < (t < n - 1 ? std::min(depth, m) : m); ++j) post_recv(t, j);
    };
    auto send_seg = [&](int t, int b, size_t e) {
      const size_t len = std::min(seg_elems, g.length(b) - e);
      const char* from = (t == t0 ? g.src : g.buf) + (g.offset(b) + e) * g.esz;
      sends.push_back(t_.isend(next, Tag::collective(seq, t), from, len * g.esz));
    };
    post_recvs(t0);
    for (size_t e = 0, b = send_block(t0); e < g.length(b); e += seg_elems) send_seg(t0, b, e);
    for (int t = t0; t < t1; ++t) {
      if (t + 1 < t1) post_recvs(t + 1);
      const int b = recv_block(t);
      const size_t m = segments(b);
      for (size_t j = 0; j < m; ++j) {
        const size_t e = j * seg_elems;
        wait_one(recvs[t % 2], j, deadline);
        if (t < n - 1) {
          const size_t off = (g.offset(b) + e) * g.esz;
          reduce(g.dt, g.op, g.buf + off, g.src + off, slot(t, j),
                 std::min(seg_elems, g.length(b) - e), t == n - 2 ? g.div : 1);
          if (j + depth < m) post_recv(t, j + depth);  // into the slot just freed
        }
        if (t + 1 < t1) send_seg(t + 1, b, e);
      }
      recvs[t % 2].clear();
    }
    // No wait between steps: a copy step overwrites the block sent n-1 steps
    // earlier, but that data comes back round the ring only after next
    // received what we sent from it. A wait per step would also deadlock
    // transports whose sends complete only once the peer posted the receive
    // (UCX rendezvous, tcp's SocketTransport): next may not post its
    // windowed receives before it finished its own step.
    wait_live(sends, deadline);
  }

  void recursive_doubling(char* buf, size_t count, DType dt, dopt_reduce_op op, int div,
                          uint64_t seq, Clock::time_point deadline) {
    const int n = t_.world_size(), r = t_.rank();
    const size_t bytes = count * dtype_size(dt);
    scratch_.resize(bytes);
    int step = 0;
    for (int mask = 1; mask < n; mask <<= 1, ++step) {
      const int peer = r ^ mask;
      const uint64_t tag = Tag::collective(seq, step);
      Handle hs[2] = {t_.irecv(peer, tag, scratch_.data(), bytes), t_.isend(peer, tag, buf, bytes)};
      t_.wait_all(hs, 2, deadline);
      const bool last = (mask << 1) >= n;
      // Lower rank's operand first: the same expression on both partners.
      if (peer < r)
        reduce(dt, op, buf, scratch_.data(), buf, count, last ? div : 1);
      else
        reduce(dt, op, buf, buf, scratch_.data(), count, last ? div : 1);
    }
  }

  void direct_exchange(char* buf, size_t count, DType dt, dopt_reduce_op op, int div, uint64_t seq,
                       Clock::time_point deadline) {
    const int n = t_.world_size(), r = t_.rank();
    const size_t bytes = count * dtype_size(dt);
    scratch_.resize(bytes * n);
    std::memcpy(scratch_.data() + r * bytes, buf, bytes);
    const uint64_t tag = Tag::collective(seq, 0);
    std::vector<Handle> hs;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      hs.push_back(t_.irecv(q, tag, scratch_.data() + q * bytes, bytes));
      hs.push_back(t_.isend(q, tag, scratch_.data() + r * bytes, bytes));
    }
    t_.wait_all(hs.data(), hs.size(), deadline);
    // Rank order: every rank evaluates the same expression.
    std::memcpy(buf, scratch_.data(), bytes);
    for (int q = 1; q < n; ++q)
      reduce(dt, op, buf, buf, scratch_.data() + q * bytes, count, q == n - 1 ? div : 1);
  }

  Transport& t_;
  CollectiveOptions o_;
  uint64_t seq_ = 0;
  std::vector<char> scratch_, work_;
};

}  // namespace distopt::sdk::p2p
