// SocketTransport (see socket_transport.hpp). Every function here runs on
// the transport's owning thread and takes no lock.
#include "socket_transport.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "socket.hpp"

namespace distopt::plugins::tcp {
namespace {

constexpr uint64_t kMaxFrame = 1ull << 40;  // sanity bound on a frame's payload
constexpr int kMaxIov = 32;                 // iovecs per sendmsg: up to 16 frames

std::string lost(int peer, int err) {
  const std::string why = err == 0            ? "peer closed"
                          : err == ECONNRESET ? "connection reset"
                          : err == EPIPE      ? "broken pipe"
                                              : std::strerror(err);
  return "connection to rank " + std::to_string(peer) + " lost (" + why + ")";
}

bool again(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }

std::string size_mismatch(int p, uint64_t tag, uint64_t got, size_t want) {
  return "message from rank " + std::to_string(p) + " (tag " + std::to_string(tag) + ") has " +
         std::to_string(got) + " bytes but the receive expects " + std::to_string(want);
}

}  // namespace

SocketTransport::SocketTransport(int rank, std::vector<int> out, std::vector<int> in, Options o)
    : rank_(rank), o_(o), peers_(out.size()) {
  o_.max_io = std::max<size_t>(o_.max_io, 4096);
  for (size_t p = 0; p < peers_.size(); ++p) {
    peers_[p].out_fd = out[p];
    peers_[p].in_fd = in[p];
  }
}

void SocketTransport::take_bytes(uint64_t* sent, uint64_t* received) {
  *sent = sent_;
  *received = received_;
  sent_ = received_ = 0;
}

SocketTransport::Handle SocketTransport::add(int peer, bool recv) {
  const Handle h = ++next_;
  Op op;
  op.peer = peer;
  op.recv = recv;
  ops_.emplace(h, std::move(op));
  return h;
}

void SocketTransport::complete(Handle h, dopt_status status, std::string why) {
  auto it = ops_.find(h);
  if (it == ops_.end()) return;
  it->second.done = true;
  it->second.status = status;
  it->second.why = std::move(why);
}

SocketTransport::Handle SocketTransport::isend(int peer, uint64_t tag, const void* data,
                                               size_t bytes) {
  const Handle h = add(peer, false);
  Peer& P = peers_[peer];
  if (!P.broken.empty()) {
    complete(h, DOPT_ERR_COMM, P.broken);
    return h;
  }
  P.sendq.push_back(SendOp{h, Header{tag, bytes}, static_cast<const char*>(data)});
  // Start at once: the peer may already wait for it.
  if (P.sendq.size() == 1) write_frames(peer);
  return h;
}

SocketTransport::Handle SocketTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  const Handle h = add(peer, true);
  Peer& P = peers_[peer];
  char* dst = static_cast<char*>(data);
  // The earliest frame with this tag: one already kept, then one arriving.
  for (auto it = P.unexpected.begin(); it != P.unexpected.end(); ++it) {
    if (it->tag != tag) continue;
    if (it->data.size() == bytes) {
      if (bytes) std::memcpy(dst, it->data.data(), bytes);
      complete(h);
    } else {
      complete(h, DOPT_ERR_INTERNAL, size_mismatch(peer, tag, it->data.size(), bytes));
    }
    P.unexpected.erase(it);
    return h;
  }
  if (!P.broken.empty()) {
    complete(h, DOPT_ERR_COMM, P.broken);
    return h;
  }
  if (P.in_payload && P.rx == 0 && P.hdr.tag == tag && P.hdr.len == bytes) {
    // Claim the frame streaming into the heap: copy what came, take the rest directly.
    if (P.got) std::memcpy(dst, P.heap.data(), P.got);
    P.dst = dst;
    P.rx = h;
    P.heap = std::vector<char>();
    return h;
  }
  if (P.held && P.hdr.tag == tag) {
    P.held = false;
    if (P.hdr.len == bytes) {
      start_payload(P, h, dst);
    } else {
      complete(h, DOPT_ERR_INTERNAL, size_mismatch(peer, tag, P.hdr.len, bytes));
      start_payload(P, 0, nullptr);
    }
    return h;
  }
  P.posted.push_back(RecvOp{h, tag, dst, bytes});
  return h;
}

bool SocketTransport::write_frames(int p) {
  Peer& P = peers_[p];
  bool moved = false;
  while (!P.sendq.empty()) {
    iovec iov[kMaxIov];
    int niov = 0;
    size_t total = 0;
    for (auto it = P.sendq.begin(); it != P.sendq.end() && niov + 2 <= kMaxIov; ++it) {
      if (total >= o_.max_io) break;
      if (it->off < sizeof(Header)) {
        iov[niov++] = {reinterpret_cast<char*>(&it->hdr) + it->off, sizeof(Header) - it->off};
        total += sizeof(Header) - it->off;
      }
      const size_t doff = it->off > sizeof(Header) ? it->off - sizeof(Header) : 0;
      const size_t n = std::min<size_t>(it->hdr.len - doff, o_.max_io);
      if (n) {
        iov[niov++] = {const_cast<char*>(it->data) + doff, n};
        total += n;
      }
      if (doff + n < it->hdr.len) break;  // capped: later frames must wait
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<size_t>(niov);
    const ssize_t k = sendmsg(P.out_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && again(errno)) break;
    if (k <= 0) {
      fail_peer(p, lost(p, k == 0 ? 0 : errno));
      return moved;
    }
    moved = true;
    if (o_.fault) o_.fault->sent(static_cast<uint64_t>(k));
    // Advance the frames the kernel took; complete the whole ones.
    size_t left = static_cast<size_t>(k);
    while (left > 0) {
      SendOp& s = P.sendq.front();
      const size_t frame = sizeof(Header) + s.hdr.len;
      const size_t step = std::min(left, frame - s.off);
      const size_t from = std::max(s.off, sizeof(Header)), to = s.off + step;
      if (to > from) sent_ += to - from;  // payload bytes only
      s.off += step;
      left -= step;
      if (s.off == frame) {
        complete(s.h);
        P.sendq.pop_front();
      }
    }
    if (static_cast<size_t>(k) < total) break;  // the socket buffer is full
  }
  return moved;
}

bool SocketTransport::read_header(Peer& P, int p, bool* moved) {
  char* at = reinterpret_cast<char*>(&P.hdr) + P.hdr_got;
  const ssize_t k = ::recv(P.in_fd, at, sizeof(Header) - P.hdr_got, MSG_DONTWAIT);
  if (k < 0 && again(errno)) return false;
  if (k <= 0) {
    fail_peer(p, lost(p, k == 0 ? 0 : errno));
    return false;
  }
  *moved = true;
  P.hdr_got += static_cast<size_t>(k);
  if (P.hdr_got < sizeof(Header)) return false;
  P.hdr_got = 0;
  return true;
}

void SocketTransport::on_header(Peer& P, int p) {
  if (P.hdr.len > kMaxFrame) {
    fail_peer(p, "malformed data frame from rank " + std::to_string(p));
    return;
  }
  for (auto it = P.posted.begin(); it != P.posted.end(); ++it) {
    if (it->tag != P.hdr.tag) continue;
    if (it->len == P.hdr.len) {
      start_payload(P, it->h, it->data);
    } else {
      complete(it->h, DOPT_ERR_INTERNAL, size_mismatch(p, P.hdr.tag, P.hdr.len, it->len));
      start_payload(P, 0, nullptr);
    }
    P.posted.erase(it);
    return;
  }
  P.held = true;  // payload left in the socket until an irecv or buffer_held takes it
}

void SocketTransport::start_payload(Peer& P, Handle h, char* dst) {
  P.in_payload = true;
  P.got = 0;
  P.rx = h;
  if (!h) {
    P.heap.resize(P.hdr.len);
    dst = P.heap.data();
  }
  P.dst = dst;
}

bool SocketTransport::buffer_held() {
  bool any = false;
  for (auto& P : peers_) {
    if (!P.held || !P.broken.empty()) continue;
    P.held = false;
    start_payload(P, 0, nullptr);
    any = true;
  }
  return any;
}

bool SocketTransport::read_payload(Peer& P, int p, bool* moved) {
  while (P.got < P.hdr.len) {
    const size_t n = std::min<size_t>(P.hdr.len - P.got, o_.max_io);
    const ssize_t k = ::recv(P.in_fd, P.dst + P.got, n, MSG_DONTWAIT);
    if (k < 0 && again(errno)) return false;
    if (k <= 0) {
      fail_peer(p, lost(p, k == 0 ? 0 : errno));
      return false;
    }
    *moved = true;
    P.got += static_cast<size_t>(k);
    received_ += static_cast<uint64_t>(k);
  }
  return true;
}

void SocketTransport::on_frame(Peer& P, int /*p*/) {
  P.in_payload = false;
  if (P.rx) {
    complete(P.rx);
    P.rx = 0;
  } else {
    P.unexpected.push_back(Unexpected{P.hdr.tag, std::move(P.heap)});
  }
  P.heap = std::vector<char>();
  P.dst = nullptr;
}

bool SocketTransport::read_frames(int p) {
  Peer& P = peers_[p];
  bool moved = false;
  while (P.broken.empty() && wants_read(P)) {
    if (!P.in_payload) {
      if (!read_header(P, p, &moved)) break;
      on_header(P, p);
      if (!P.broken.empty() || P.held) break;
    }
    if (!read_payload(P, p, &moved)) break;
    const bool matched = P.rx != 0;
    on_frame(P, p);
    // Back to the caller while the payload is still in cache: it may be
    // waiting to reduce exactly this segment.
    if (matched) break;
  }
  return moved;
}

void SocketTransport::fail_peer(int p, const std::string& why) {
  Peer& P = peers_[p];
  if (!P.broken.empty()) return;
  P.broken = why;
  if (failed_peer_ < 0) failed_peer_ = p;
  for (auto& s : P.sendq) complete(s.h, DOPT_ERR_COMM, why);
  for (auto& r : P.posted) complete(r.h, DOPT_ERR_COMM, why);
  if (P.rx) complete(P.rx, DOPT_ERR_COMM, why);
  P.sendq.clear();
  P.posted.clear();
  P.rx = 0;
  P.in_payload = false;
  P.held = false;
}

bool SocketTransport::progress() {
  bool moved = false;
  for (int p = 0; p < world_size(); ++p) {
    Peer& P = peers_[p];
    if (p == rank_ || !P.broken.empty()) continue;
    if (!P.sendq.empty()) moved |= write_frames(p);
    if (wants_read(P)) moved |= read_frames(p);
  }
  return moved;
}

void SocketTransport::wait_for_io(Clock::time_point deadline) {
  std::vector<pollfd> pf;
  for (int p = 0; p < world_size(); ++p) {
    const Peer& P = peers_[p];
    if (p == rank_ || !P.broken.empty()) continue;
    if (!P.sendq.empty()) pf.push_back({P.out_fd, POLLOUT, 0});
    if (wants_read(P)) pf.push_back({P.in_fd, POLLIN, 0});
  }
  // Once the abort is seen the eventfd stays readable: poll briefly instead.
  const bool grace = aborted_at_ != Clock::time_point{};
  if (o_.abort_fd >= 0 && !grace) pf.push_back({o_.abort_fd, POLLIN, 0});
  poll(pf.data(), pf.size(), poll_ms(deadline, grace ? 5 : 500));
}

void SocketTransport::throw_if_failed(const Handle* hs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    auto it = ops_.find(hs[i]);
    if (it != ops_.end() && it->second.done && it->second.status != DOPT_OK)
      throw sdk::Error(it->second.status, it->second.why);
  }
  if (o_.destroy && o_.destroy->load(std::memory_order_relaxed))
    throw sdk::Error(DOPT_ERR_ABORTED, "communicator destroyed");
  if (!o_.abort || !o_.abort->load(std::memory_order_relaxed)) return;
  const auto now = Clock::now();
  if (aborted_at_ == Clock::time_point{}) aborted_at_ = now;
  if (now - aborted_at_ >= o_.abort_grace ||
      now - std::max(aborted_at_, moved_at_) >= o_.abort_idle)
    throw sdk::Error(DOPT_ERR_ABORTED, "communicator failed");
}

int SocketTransport::outstanding_peer(const Handle* hs, size_t n) const {
  int peer = -1;
  for (size_t i = 0; i < n; ++i) {
    auto it = ops_.find(hs[i]);
    if (it == ops_.end() || it->second.done) continue;
    if (it->second.recv) return it->second.peer;
    if (peer < 0) peer = it->second.peer;
  }
  return peer;
}

void SocketTransport::release(const Handle* hs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    auto it = ops_.find(hs[i]);
    if (it == ops_.end()) continue;
    if (!it->second.done) {
      Peer& P = peers_[it->second.peer];
      const Handle h = hs[i];
      auto rp =
          std::find_if(P.posted.begin(), P.posted.end(), [h](const RecvOp& r) { return r.h == h; });
      if (rp != P.posted.end()) P.posted.erase(rp);
      auto sp =
          std::find_if(P.sendq.begin(), P.sendq.end(), [h](const SendOp& s) { return s.h == h; });
      // A frame cut off mid-way, or a buffer the stream still writes into:
      // this connection can no longer be used (the communicator is failed).
      const bool cut = (sp != P.sendq.end() && sp->off > 0) || P.rx == h;
      if (sp != P.sendq.end()) P.sendq.erase(sp);
      if (cut && P.broken.empty()) {
        P.broken = "an operation with rank " + std::to_string(it->second.peer) + " was abandoned";
        for (auto& s : P.sendq) complete(s.h, DOPT_ERR_COMM, P.broken);
        for (auto& r : P.posted) complete(r.h, DOPT_ERR_COMM, P.broken);
        P.sendq.clear();
        P.posted.clear();
        P.rx = 0;
        P.in_payload = false;
      }
    }
    ops_.erase(it);
  }
}

bool SocketTransport::test(Handle h) {
  if (!progress()) buffer_held();
  throw_if_failed(&h, 1);
  auto it = ops_.find(h);
  if (it == ops_.end() || !it->second.done) return false;
  ops_.erase(it);
  return true;
}

void SocketTransport::wait_all(const Handle* hs, size_t n, Clock::time_point deadline) {
  try {
    while (true) {
      const bool moved = progress();
      if (moved) moved_at_ = Clock::now();
      throw_if_failed(hs, n);
      bool all = true;
      for (size_t i = 0; i < n && all; ++i) {
        auto it = ops_.find(hs[i]);
        all = it == ops_.end() || it->second.done;
      }
      if (all) break;
      if (moved || buffer_held()) continue;
      if (Clock::now() >= deadline) {
        const int p = outstanding_peer(hs, n);
        throw sdk::Error(DOPT_ERR_TIMEOUT, "timed out waiting for rank " + std::to_string(p));
      }
      wait_for_io(deadline);
    }
  } catch (...) {
    release(hs, n);
    throw;
  }
  release(hs, n);
}

}  // namespace distopt::plugins::tcp
