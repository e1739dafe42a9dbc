// The control channel thread (see p2p.hpp).
#include "p2p.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>

#include "comm.hpp"

namespace distopt::plugins::tcp {
namespace {

// kPing: a header alone, sent when the connection idled for a ping interval,
// so a silent peer is one that is unreachable or stopped (see silence()).
enum : uint32_t { kData = 1, kBye = 2, kAbort = 3, kPing = 4 };
struct Header {
  uint32_t type;
  int32_t tag;
  uint64_t len;
};
static_assert(sizeof(Header) == 16, "control frame header is 16 bytes");
constexpr uint64_t kMaxAbort = 4096;          // an abort notice is one line
constexpr uint64_t kMaxMessage = 1ull << 40;  // sanity bound on a p2p message

struct TxItem {
  Header hdr;
  const char* data;
  size_t len;
  size_t off = 0;  // over header + data
  std::shared_ptr<sdk::Completion> req;
  Clock::time_point deadline;
  std::string owned;  // ABORT payload
};
struct Posted {
  int tag;
  char* dst;
  size_t len;
  std::shared_ptr<sdk::Completion> req;
  Clock::time_point deadline;
};
struct Unexpected {
  int tag;
  std::vector<char> data;
};

struct Peer {
  int fd = -1;
  bool open = false;
  bool broken_tx = false;  // a frame was cut off: nothing more may be sent
  std::deque<TxItem> tx;
  // receive state
  Header hdr{};
  size_t hdr_got = 0;
  bool in_payload = false;
  char* dst = nullptr;
  size_t got = 0;
  std::vector<char> heap;
  std::shared_ptr<sdk::Completion> rx_req;
  size_t want_len = 0;  // the posted buffer's size, when it does not match
  Clock::time_point rx_deadline;
  std::deque<Posted> posted;
  std::deque<Unexpected> unexpected;
  Clock::time_point next_ping;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Cmd {
  enum Kind { Send, Recv, Fail, Stop } kind;
  explicit Cmd(Kind k) : kind(k) {}
  int peer = -1, tag = 0;
  char* data = nullptr;
  size_t len = 0;
  std::shared_ptr<sdk::Completion> req;
  dopt_status status = DOPT_OK;
  std::string cause;
  bool notify = false;
};

std::string errno_reason(int e) {
  return e == 0            ? "peer closed"
         : e == ECONNRESET ? "connection reset"
         : e == EPIPE      ? "broken pipe"
                           : std::strerror(e);
}

}  // namespace

struct Control::State {
  int rank = 0;
  double timeout_s = 60;
  std::vector<Peer> peers;
  int wake_fd = -1;
  std::mutex mu;
  std::vector<Cmd> inbox;
  std::vector<std::atomic<bool>> bye;               // read by the progress thread
  std::vector<std::atomic<int64_t>> last_heard_ns;  // any byte from the peer; read by silence()
  Clock::duration ping_every{};
  // ctrl thread only:
  bool failed = false;
  dopt_status fail_status = DOPT_OK;
  std::string fail_cause;
  bool stopping = false;
  Clock::time_point stop_deadline;
};

Control::Control(TcpComm* comm, int rank, std::vector<int> fds) : comm_(comm), st_(new State) {
  st_->rank = rank;
  st_->timeout_s = comm->timeout_s();
  st_->peers.resize(fds.size());
  st_->bye = std::vector<std::atomic<bool>>(fds.size());
  st_->last_heard_ns = std::vector<std::atomic<int64_t>>(fds.size());
  for (auto& t : st_->last_heard_ns) t = now_ns();
  // A ping interval of timeout_s / 8 (at most 1 s): a peer is silent after
  // three missed pings, well inside the operation timeout.
  st_->ping_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(comm->timeout_s() / 8, 0.01, 1.0)));
  for (size_t p = 0; p < fds.size(); ++p) {
    st_->peers[p].fd = fds[p];
    st_->peers[p].open = fds[p] >= 0;
  }
  st_->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (st_->wake_fd < 0)
    throw sdk::Error(DOPT_ERR_INTERNAL, std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

Control::~Control() {
  if (thread_.joinable()) stop();
  if (st_->wake_fd >= 0) close(st_->wake_fd);
}

bool Control::said_bye(int peer) const { return st_->bye[peer].load(); }
const std::atomic<bool>* Control::bye_flags() const { return st_->bye.data(); }

std::string Control::silence() const {
  const int64_t now = now_ns();
  const int64_t limit =
      3 * std::chrono::duration_cast<std::chrono::nanoseconds>(st_->ping_every).count();
  std::string who;
  int count = 0;
  int64_t least = INT64_MAX;
  for (size_t p = 0; p < st_->last_heard_ns.size(); ++p) {
    if (static_cast<int>(p) == st_->rank || st_->bye[p]) continue;
    const int64_t quiet = now - st_->last_heard_ns[p].load();
    if (quiet <= limit) continue;
    who += (count++ ? ", " : "") + std::to_string(p);
    least = std::min(least, quiet);
  }
  if (!count) return "";
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(least) / 1e9);
  return (count > 1 ? "ranks " : "rank ") + who + " silent for " + secs +
         " s (unreachable, or stopped)";
}

void Control::wake() {
  uint64_t one = 1;
  (void)!write(st_->wake_fd, &one, sizeof one);
}

void Control::post_send(int peer, int tag, const char* data, size_t len,
                        std::shared_ptr<sdk::Completion> req) {
  Cmd c(Cmd::Send);
  c.peer = peer, c.tag = tag, c.data = const_cast<char*>(data), c.len = len, c.req = std::move(req);
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(std::move(c));
  }
  wake();
}

void Control::post_recv(int peer, int tag, char* data, size_t len,
                        std::shared_ptr<sdk::Completion> req) {
  Cmd c(Cmd::Recv);
  c.peer = peer, c.tag = tag, c.data = data, c.len = len, c.req = std::move(req);
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(std::move(c));
  }
  wake();
}

void Control::on_failure(dopt_status status, const std::string& cause, bool notify) {
  Cmd c(Cmd::Fail);
  c.status = status, c.cause = cause, c.notify = notify;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(std::move(c));
  }
  wake();
}

void Control::stop() {
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(Cmd(Cmd::Stop));
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

void Control::loop() {
  State& S = *st_;
  const int n = static_cast<int>(S.peers.size());
  auto timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(S.timeout_s));

  auto fail_req = [](const std::shared_ptr<sdk::Completion>& r, dopt_status st,
                     const std::string& cause) {
    if (r) r->complete(st, r->op() + ": " + cause);
  };
  // Complete every pending p2p request of every peer with (st, cause).
  auto fail_pending = [&](dopt_status st, const std::string& cause) {
    for (auto& P : S.peers) {
      for (auto& it : P.tx) fail_req(it.req, st, cause);
      for (auto& po : P.posted) fail_req(po.req, st, cause);
      P.posted.clear();
      fail_req(P.rx_req, st, cause);
      P.rx_req.reset();
      // A frame already partly on the wire cannot be followed by a notice.
      if (!P.tx.empty() && P.tx.front().off > 0) P.broken_tx = true;
      P.tx.clear();
    }
  };
  auto report = [&](dopt_status st, const std::string& cause, bool notify) {
    // Goes through the communicator so the progress thread learns too; it
    // comes back here as a Fail command.
    comm_->fail(st, cause, notify);
  };
  auto push_notice = [&](Peer& P, uint32_t type, const std::string& payload) {
    if (!P.open || P.broken_tx) return;
    TxItem it{};
    it.hdr = Header{type, 0, payload.size()};
    it.owned = payload;
    it.len = payload.size();
    it.deadline = Clock::now() + std::chrono::seconds(2);
    P.tx.push_back(std::move(it));
    P.tx.back().data = P.tx.back().owned.data();
  };

  // A message that arrived with no receive posted for it (so it streamed
  // into P.heap) goes to a receive posted while its payload was arriving,
  // the first of its tag, before it would be kept as unexpected.
  auto deliver_to_posted = [&](Peer& P, int p) {
    for (auto it = P.posted.begin(); it != P.posted.end(); ++it) {
      if (it->tag != P.hdr.tag) continue;
      if (it->len == P.heap.size()) {
        if (it->len) std::memcpy(it->dst, P.heap.data(), it->len);
        it->req->complete(DOPT_OK);
      } else {
        fail_req(it->req, DOPT_ERR_INVALID_ARGUMENT,
                 "message from rank " + std::to_string(p) + " (tag " + std::to_string(P.hdr.tag) +
                     ") has " + std::to_string(P.heap.size()) + " bytes but the buffer has " +
                     std::to_string(it->len));
      }
      P.posted.erase(it);
      return true;
    }
    return false;
  };

  std::vector<pollfd> pfds;
  std::vector<int> who;
  while (true) {
    // 1. Commands from API threads.
    std::vector<Cmd> cmds;
    {
      std::lock_guard<std::mutex> lk(S.mu);
      cmds.swap(S.inbox);
    }
    for (auto& c : cmds) {
      if (c.kind == Cmd::Send) {
        if (S.failed || S.stopping) {
          fail_req(c.req, S.failed ? S.fail_status : DOPT_ERR_ABORTED,
                   S.failed ? S.fail_cause : "aborted (communicator destroyed)");
          continue;
        }
        Peer& P = S.peers[c.peer];
        if (!P.open || S.bye[c.peer]) {
          fail_req(c.req, DOPT_ERR_COMM,
                   "rank " + std::to_string(c.peer) + " closed the communicator");
          continue;
        }
        TxItem it{};
        it.hdr = Header{kData, c.tag, c.len};
        it.data = c.data;
        it.len = c.len;
        it.req = c.req;
        it.deadline = Clock::now() + timeout;
        P.tx.push_back(std::move(it));
      } else if (c.kind == Cmd::Recv) {
        if (S.failed || S.stopping) {
          fail_req(c.req, S.failed ? S.fail_status : DOPT_ERR_ABORTED,
                   S.failed ? S.fail_cause : "aborted (communicator destroyed)");
          continue;
        }
        Peer& P = S.peers[c.peer];
        bool matched = false;
        for (auto it = P.unexpected.begin(); it != P.unexpected.end(); ++it) {
          if (it->tag != c.tag) continue;
          if (it->data.size() == c.len) {
            if (c.len) std::memcpy(c.data, it->data.data(), c.len);
            c.req->complete(DOPT_OK);
          } else {
            fail_req(c.req, DOPT_ERR_INVALID_ARGUMENT,
                     "message from rank " + std::to_string(c.peer) + " (tag " +
                         std::to_string(c.tag) + ") has " + std::to_string(it->data.size()) +
                         " bytes but the buffer has " + std::to_string(c.len));
          }
          P.unexpected.erase(it);
          matched = true;
          break;
        }
        if (matched) continue;
        if (!P.open || S.bye[c.peer]) {
          fail_req(c.req, DOPT_ERR_COMM,
                   "rank " + std::to_string(c.peer) + " closed the communicator");
          continue;
        }
        P.posted.push_back(Posted{c.tag, c.data, c.len, c.req, Clock::now() + timeout});
      } else if (c.kind == Cmd::Fail) {
        if (S.failed) continue;
        S.failed = true;
        S.fail_status = c.status;
        S.fail_cause = c.cause;
        fail_pending(c.status, c.cause);
        if (c.notify && !S.stopping)
          for (auto& P : S.peers)
            push_notice(P, kAbort, "rank " + std::to_string(S.rank) + " reported: " + c.cause);
      } else if (c.kind == Cmd::Stop) {
        if (S.stopping) continue;
        S.stopping = true;
        S.stop_deadline = Clock::now() + std::chrono::seconds(2);
        fail_pending(DOPT_ERR_ABORTED, "aborted (communicator destroyed)");
        for (auto& P : S.peers) push_notice(P, kBye, "");
      }
    }
    if (S.stopping) {
      bool flushed = true;
      for (auto& P : S.peers)
        if (P.open && !P.tx.empty()) flushed = false;
      if (flushed || Clock::now() >= S.stop_deadline) return;
    }

    // 2. Keep-alive pings on idle connections, then wait for I/O, a command,
    // or the nearest deadline.
    const auto now0 = Clock::now();
    auto next = now0 + std::chrono::seconds(1);
    for (auto& P : S.peers) {
      if (!P.open || P.broken_tx || S.failed || S.stopping) continue;
      if (P.tx.empty() && now0 >= P.next_ping) {
        push_notice(P, kPing, "");
        P.tx.back().deadline = now0 + timeout;  // a stalled ping is a stalled link
      }
      if (now0 >= P.next_ping) P.next_ping = now0 + S.ping_every;
      next = std::min(next, P.next_ping);
    }
    pfds.clear();
    who.clear();
    pfds.push_back({S.wake_fd, POLLIN, 0});
    who.push_back(-1);
    for (int p = 0; p < n; ++p) {
      Peer& P = S.peers[p];
      if (!P.open) continue;
      short ev = POLLIN;
      if (!P.tx.empty()) {
        ev |= POLLOUT;
        next = std::min(next, P.tx.front().deadline);
      }
      for (auto& po : P.posted) next = std::min(next, po.deadline);
      if (P.in_payload) next = std::min(next, P.rx_deadline);
      pfds.push_back({P.fd, ev, 0});
      who.push_back(p);
    }
    if (S.stopping) next = std::min(next, S.stop_deadline);
    poll(pfds.data(), pfds.size(), poll_ms(next, 1000));
    if (pfds[0].revents) {
      uint64_t v;
      (void)!read(S.wake_fd, &v, sizeof v);
    }

    // 3. I/O.
    for (size_t i = 1; i < pfds.size(); ++i) {
      const int p = who[i];
      Peer& P = S.peers[p];
      const short rev = pfds[i].revents;
      if (!rev) continue;

      // Writes: header and payload in one sendmsg.
      while ((rev & (POLLOUT | POLLERR | POLLHUP)) && !P.tx.empty() && P.open) {
        TxItem& it = P.tx.front();
        iovec iov[2];
        int niov = 0;
        if (it.off < sizeof(Header))
          iov[niov++] = {reinterpret_cast<char*>(&it.hdr) + it.off, sizeof(Header) - it.off};
        size_t doff = it.off > sizeof(Header) ? it.off - sizeof(Header) : 0;
        if (it.len > doff) iov[niov++] = {const_cast<char*>(it.data) + doff, it.len - doff};
        ssize_t k = 0;
        if (niov) {
          msghdr mh{};
          mh.msg_iov = iov;
          mh.msg_iovlen = niov;
          k = sendmsg(P.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
          if (k < 0) {
            int e = errno;
            P.open = false;
            if (!S.failed && !S.stopping && !S.bye[p])
              report(DOPT_ERR_COMM,
                     "connection to rank " + std::to_string(p) + " lost (" + errno_reason(e) + ")",
                     true);
            break;
          }
        }
        it.off += static_cast<size_t>(k);
        if (it.off == sizeof(Header) + it.len) {
          if (it.hdr.type == kData) sdk::metric_add("comm.bytes_sent", static_cast<double>(it.len));
          if (it.req) it.req->complete(DOPT_OK);
          P.tx.pop_front();
        }
      }

      // Reads: as much as is available.
      while ((rev & (POLLIN | POLLERR | POLLHUP)) && P.open) {
        char* target;
        size_t want;
        if (!P.in_payload) {
          target = reinterpret_cast<char*>(&P.hdr) + P.hdr_got;
          want = sizeof(Header) - P.hdr_got;
        } else {
          target = (P.dst ? P.dst : P.heap.data()) + P.got;
          want = P.hdr.len - P.got;
        }
        ssize_t k = want ? ::recv(P.fd, target, want, MSG_DONTWAIT) : 0;
        if (want && k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (k > 0) S.last_heard_ns[p] = now_ns();
        if (want && k <= 0) {
          int e = k == 0 ? 0 : errno;
          P.open = false;
          if (S.bye[p]) break;  // it said goodbye first: a clean close
          if (!S.failed && !S.stopping)
            report(DOPT_ERR_COMM,
                   "connection to rank " + std::to_string(p) + " lost (" + errno_reason(e) + ")",
                   true);
          break;
        }
        if (!P.in_payload) {
          P.hdr_got += static_cast<size_t>(k);
          if (P.hdr_got < sizeof(Header)) continue;
          P.hdr_got = 0;
          const Header& h = P.hdr;
          if (h.type == kBye) {
            S.bye[p] = true;
            for (auto& po : P.posted)
              fail_req(po.req, DOPT_ERR_COMM,
                       "rank " + std::to_string(p) + " closed the communicator");
            P.posted.clear();
            continue;
          }
          if (h.type == kPing && h.len == 0) continue;
          if ((h.type != kData && h.type != kAbort) || (h.type == kAbort && h.len > kMaxAbort) ||
              h.len > kMaxMessage) {
            P.open = false;
            if (!S.failed && !S.stopping)
              report(DOPT_ERR_COMM, "malformed control frame from rank " + std::to_string(p), true);
            break;
          }
          P.in_payload = true;
          P.got = 0;
          P.dst = nullptr;
          P.want_len = 0;
          P.rx_deadline = Clock::now() + timeout;
          if (h.type == kData) {
            for (auto it = P.posted.begin(); it != P.posted.end(); ++it) {
              if (it->tag != h.tag) continue;
              P.rx_req = it->req;
              if (it->len == h.len)
                P.dst = it->dst;
              else
                P.want_len = it->len + 1;  // +1: a zero-length buffer is still a mismatch
              P.posted.erase(it);
              break;
            }
          }
          if (!P.dst) P.heap.assign(h.len, 0);
        } else {
          P.got += static_cast<size_t>(k);
        }
        if (P.in_payload && P.got == P.hdr.len) {
          P.in_payload = false;
          if (P.hdr.type == kAbort) {
            std::string cause(P.heap.begin(), P.heap.end());
            report(DOPT_ERR_COMM, cause, false);
          } else {
            sdk::metric_add("comm.bytes_received", static_cast<double>(P.hdr.len));
            if (P.rx_req) {
              if (P.want_len)
                fail_req(P.rx_req, DOPT_ERR_INVALID_ARGUMENT,
                         "message from rank " + std::to_string(p) + " (tag " +
                             std::to_string(P.hdr.tag) + ") has " + std::to_string(P.hdr.len) +
                             " bytes but the buffer has " + std::to_string(P.want_len - 1));
              else
                P.rx_req->complete(DOPT_OK);
              P.rx_req.reset();
            } else if (!deliver_to_posted(P, p)) {
              P.unexpected.push_back(Unexpected{P.hdr.tag, std::move(P.heap)});
            }
          }
          P.heap = std::vector<char>();
        }
      }
    }

    // 4. Deadlines.
    auto now = Clock::now();
    for (int p = 0; p < n; ++p) {
      Peer& P = S.peers[p];
      for (auto it = P.posted.begin(); it != P.posted.end();) {
        if (now < it->deadline) {
          ++it;
          continue;
        }
        const std::string silent = silence();
        fail_req(it->req, DOPT_ERR_TIMEOUT,
                 "timed out waiting for a message from rank " + std::to_string(p) + " (tag " +
                     std::to_string(it->tag) + ")" + (silent.empty() ? "" : "; " + silent));
        it = P.posted.erase(it);
      }
      if (S.failed || S.stopping) continue;
      if (!P.tx.empty() && now >= P.tx.front().deadline)
        report(DOPT_ERR_TIMEOUT, "timed out sending to rank " + std::to_string(p), true);
      else if (P.in_payload && now >= P.rx_deadline)
        report(DOPT_ERR_TIMEOUT, "timed out receiving a message from rank " + std::to_string(p),
               true);
    }
  }
}

}  // namespace distopt::plugins::tcp
