// The control channel thread (see control_channel.hpp).
#include "control_channel.hpp"

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

#include "tcp_comm.hpp"

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

// The control thread's state and its handlers (Gloo's tcp::Pair splits its
// event loop the same way). Lock rule: `mu` guards `inbox` only; API threads
// push commands under it, and the control thread takes it only to swap the
// inbox out (take_commands). Every handler below runs on the control thread
// WITHOUT `mu` held: report() calls back into TcpComm::fail, which queues a
// Fail command under `mu` (and takes TcpComm's own failure mutex). The
// atomics (bye, last_heard_ns) are also read by other threads.
struct ControlChannel::State {
  TcpComm* comm = nullptr;
  int rank = 0;
  double timeout_s = 60;
  Clock::duration timeout{};
  std::vector<Peer> peers;
  int wake_fd = -1;
  std::mutex mu;
  std::vector<Cmd> inbox;                           // guarded by mu
  std::vector<std::atomic<bool>> bye;               // read by the progress thread
  std::vector<std::atomic<int64_t>> last_heard_ns;  // any byte from the peer; read by silence()
  Clock::duration ping_every{};
  // ctrl thread only:
  bool failed = false;
  dopt_status fail_status = DOPT_OK;
  std::string fail_cause;
  bool stopping = false;
  Clock::time_point stop_deadline;
  std::vector<pollfd> pfds;
  std::vector<int> peer_of;  // pfds[i] belongs to rank peer_of[i] (-1: the wake fd)

  /// The event loop: commands, keep-alives, poll, I/O, deadlines.
  void run(const ControlChannel& c);

  // Commands (control thread, mu not held).
  /// Swap the inbox out. Takes mu.
  std::vector<Cmd> take_commands();
  void on_send_cmd(Cmd& c);
  void on_recv_cmd(Cmd& c);
  void on_fail_cmd(Cmd& c);
  void on_stop_cmd();
  /// While stopping: true once every notice is flushed or the stop deadline passed.
  bool stop_done() const;

  // Keep-alive and waiting (control thread, mu not held).
  /// Queue a PING on connections idle for a ping interval; returns when the
  /// next one is due.
  Clock::time_point keep_alive();
  /// poll() the wake fd and every open peer until I/O, a command or `next`.
  void wait_io(Clock::time_point next);

  // I/O handlers for rank p (control thread, mu not held).
  /// Write queued frames (header and payload in one sendmsg) until EAGAIN.
  void on_writable(int p);
  /// Read header and payload bytes until EAGAIN or the connection closed.
  void on_readable(int p);
  /// The 16 header bytes are in: BYE, PING, ABORT or DATA (false: stop reading).
  bool on_header(int p);
  /// A DATA header: the payload goes into the first receive posted for its
  /// tag, else into the heap.
  void on_data_header(int p);
  /// The payload is complete: ABORT notice, or a message to deliver.
  void on_payload(int p);
  /// A message that streamed into the heap: the receive posted meanwhile,
  /// else kept as unexpected.
  void deliver_unmatched(int p);

  // Failures (control thread, mu not held).
  /// Rank p's connection failed with errno `e` (0: EOF): reported unless
  /// it said BYE first or this end is already failed / stopping.
  void on_lost(int p, int e);
  /// Record a failure through the communicator (it comes back as a Fail command).
  void report(dopt_status st, const std::string& cause, bool notify);
  /// Complete every pending p2p request of every peer with (st, cause).
  void fail_pending(dopt_status st, const std::string& cause);
  /// Queue a BYE / ABORT / PING frame to P (not after a cut-off frame).
  void push_notice(Peer& P, uint32_t type, const std::string& payload);
  /// Time out posted receives, stalled sends and stalled payloads.
  void check_deadlines(const ControlChannel& c);
};

namespace {

void fail_req(const std::shared_ptr<sdk::Completion>& r, dopt_status st, const std::string& cause) {
  if (r) r->complete(st, r->op() + ": " + cause);
}

std::string mismatch(int p, int tag, size_t got, size_t want) {
  return "message from rank " + std::to_string(p) + " (tag " + std::to_string(tag) + ") has " +
         std::to_string(got) + " bytes but the buffer has " + std::to_string(want);
}

std::string closed(int p) { return "rank " + std::to_string(p) + " closed the communicator"; }

}  // namespace

std::vector<Cmd> ControlChannel::State::take_commands() {
  std::vector<Cmd> cmds;
  std::lock_guard<std::mutex> lk(mu);
  cmds.swap(inbox);
  return cmds;
}

void ControlChannel::State::on_send_cmd(Cmd& c) {
  if (failed || stopping) {
    fail_req(c.req, failed ? fail_status : DOPT_ERR_ABORTED,
             failed ? fail_cause : "aborted (communicator destroyed)");
    return;
  }
  Peer& P = peers[c.peer];
  if (!P.open || bye[c.peer]) {
    fail_req(c.req, DOPT_ERR_COMM, closed(c.peer));
    return;
  }
  TxItem it{};
  it.hdr = Header{kData, c.tag, c.len};
  it.data = c.data;
  it.len = c.len;
  it.req = c.req;
  it.deadline = Clock::now() + timeout;
  P.tx.push_back(std::move(it));
}

void ControlChannel::State::on_recv_cmd(Cmd& c) {
  // A message that arrived whole before the communicator failed is still
  // delivered (an elastic commit's buddy copy from a rank that died since).
  Peer& P = peers[c.peer];
  for (auto it = P.unexpected.begin(); it != P.unexpected.end(); ++it) {
    if (it->tag != c.tag) continue;
    if (it->data.size() == c.len) {
      if (c.len) std::memcpy(c.data, it->data.data(), c.len);
      c.req->complete(DOPT_OK);
    } else {
      fail_req(c.req, DOPT_ERR_INVALID_ARGUMENT, mismatch(c.peer, c.tag, it->data.size(), c.len));
    }
    P.unexpected.erase(it);
    return;
  }
  if (failed || stopping) {
    fail_req(c.req, failed ? fail_status : DOPT_ERR_ABORTED,
             failed ? fail_cause : "aborted (communicator destroyed)");
    return;
  }
  if (!P.open || bye[c.peer]) {
    fail_req(c.req, DOPT_ERR_COMM, closed(c.peer));
    return;
  }
  P.posted.push_back(Posted{c.tag, c.data, c.len, c.req, Clock::now() + timeout});
}

void ControlChannel::State::on_fail_cmd(Cmd& c) {
  if (failed) return;
  failed = true;
  fail_status = c.status;
  fail_cause = c.cause;
  fail_pending(c.status, c.cause);
  if (c.notify && !stopping)
    for (auto& P : peers)
      push_notice(P, kAbort, "rank " + std::to_string(rank) + " reported: " + c.cause);
}

void ControlChannel::State::on_stop_cmd() {
  if (stopping) return;
  stopping = true;
  stop_deadline = Clock::now() + std::chrono::seconds(2);
  fail_pending(DOPT_ERR_ABORTED, "aborted (communicator destroyed)");
  for (auto& P : peers) push_notice(P, kBye, "");
}

bool ControlChannel::State::stop_done() const {
  for (const auto& P : peers)
    if (P.open && !P.tx.empty()) return Clock::now() >= stop_deadline;
  return true;
}

void ControlChannel::State::fail_pending(dopt_status st, const std::string& cause) {
  for (auto& P : peers) {
    for (auto& it : P.tx) fail_req(it.req, st, cause);
    for (auto& po : P.posted) fail_req(po.req, st, cause);
    P.posted.clear();
    fail_req(P.rx_req, st, cause);
    P.rx_req.reset();
    // A frame already partly on the wire cannot be followed by a notice.
    if (!P.tx.empty() && P.tx.front().off > 0) P.broken_tx = true;
    P.tx.clear();
  }
}

void ControlChannel::State::report(dopt_status st, const std::string& cause, bool notify) {
  // Through the communicator, so the progress thread learns too.
  comm->fail(st, cause, notify);
}

void ControlChannel::State::push_notice(Peer& P, uint32_t type, const std::string& payload) {
  if (!P.open || P.broken_tx) return;
  TxItem it{};
  it.hdr = Header{type, 0, payload.size()};
  it.owned = payload;
  it.len = payload.size();
  it.deadline = Clock::now() + std::chrono::seconds(2);
  P.tx.push_back(std::move(it));
  P.tx.back().data = P.tx.back().owned.data();
}

Clock::time_point ControlChannel::State::keep_alive() {
  const auto now = Clock::now();
  auto next = now + std::chrono::seconds(1);
  for (auto& P : peers) {
    if (!P.open || P.broken_tx || failed || stopping) continue;
    if (P.tx.empty() && now >= P.next_ping) {
      push_notice(P, kPing, "");
      P.tx.back().deadline = now + timeout;  // a stalled ping is a stalled link
    }
    if (now >= P.next_ping) P.next_ping = now + ping_every;
    next = std::min(next, P.next_ping);
  }
  return next;
}

void ControlChannel::State::wait_io(Clock::time_point next) {
  pfds.clear();
  peer_of.clear();
  pfds.push_back({wake_fd, POLLIN, 0});
  peer_of.push_back(-1);
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    Peer& P = peers[p];
    if (!P.open) continue;
    short ev = POLLIN;
    if (!P.tx.empty()) {
      ev |= POLLOUT;
      next = std::min(next, P.tx.front().deadline);
    }
    for (auto& po : P.posted) next = std::min(next, po.deadline);
    if (P.in_payload) next = std::min(next, P.rx_deadline);
    pfds.push_back({P.fd, ev, 0});
    peer_of.push_back(p);
  }
  if (stopping) next = std::min(next, stop_deadline);
  poll(pfds.data(), pfds.size(), poll_ms(next, 1000));
  if (pfds[0].revents) {
    uint64_t v;
    (void)!read(wake_fd, &v, sizeof v);
  }
}

void ControlChannel::State::on_lost(int p, int e) {
  peers[p].open = false;
  if (bye[p] || failed || stopping) return;  // after a goodbye: a clean close
  report(DOPT_ERR_COMM,
         "connection to rank " + std::to_string(p) + " lost (" + errno_reason(e) + ")", true);
}

void ControlChannel::State::on_writable(int p) {
  Peer& P = peers[p];
  while (!P.tx.empty() && P.open) {
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
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (k < 0) {
        on_lost(p, errno);
        return;
      }
    }
    it.off += static_cast<size_t>(k);
    if (it.off < sizeof(Header) + it.len) continue;
    if (it.hdr.type == kData) sdk::metric_add("comm.bytes_sent", static_cast<double>(it.len));
    if (it.req) it.req->complete(DOPT_OK);
    P.tx.pop_front();
  }
}

void ControlChannel::State::on_readable(int p) {
  Peer& P = peers[p];
  while (P.open) {
    char* target;
    size_t want;
    if (!P.in_payload) {
      target = reinterpret_cast<char*>(&P.hdr) + P.hdr_got;
      want = sizeof(Header) - P.hdr_got;
    } else {
      target = (P.dst ? P.dst : P.heap.data()) + P.got;
      want = P.hdr.len - P.got;
    }
    const ssize_t k = want ? ::recv(P.fd, target, want, MSG_DONTWAIT) : 0;
    if (want && k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k > 0) last_heard_ns[p] = now_ns();
    if (want && k <= 0) {
      on_lost(p, k == 0 ? 0 : errno);
      return;
    }
    if (!P.in_payload) {
      P.hdr_got += static_cast<size_t>(k);
      if (P.hdr_got < sizeof(Header)) continue;
      P.hdr_got = 0;
      if (!on_header(p)) return;
    } else {
      P.got += static_cast<size_t>(k);
    }
    if (P.in_payload && P.got == P.hdr.len) on_payload(p);
  }
}

bool ControlChannel::State::on_header(int p) {
  Peer& P = peers[p];
  const Header& h = P.hdr;
  if (h.type == kBye) {
    bye[p] = true;
    for (auto& po : P.posted) fail_req(po.req, DOPT_ERR_COMM, closed(p));
    P.posted.clear();
    return true;
  }
  if (h.type == kPing && h.len == 0) return true;
  if ((h.type != kData && h.type != kAbort) || (h.type == kAbort && h.len > kMaxAbort) ||
      h.len > kMaxMessage) {
    P.open = false;
    if (!failed && !stopping)
      report(DOPT_ERR_COMM, "malformed control frame from rank " + std::to_string(p), true);
    return false;
  }
  P.in_payload = true;
  P.got = 0;
  P.dst = nullptr;
  P.want_len = 0;
  P.rx_deadline = Clock::now() + timeout;
  if (h.type == kData) on_data_header(p);
  if (!P.dst) P.heap.assign(h.len, 0);
  return true;
}

void ControlChannel::State::on_data_header(int p) {
  Peer& P = peers[p];
  for (auto it = P.posted.begin(); it != P.posted.end(); ++it) {
    if (it->tag != P.hdr.tag) continue;
    P.rx_req = it->req;
    if (it->len == P.hdr.len)
      P.dst = it->dst;
    else
      P.want_len = it->len + 1;  // +1: a zero-length buffer is still a mismatch
    P.posted.erase(it);
    return;
  }
}

void ControlChannel::State::on_payload(int p) {
  Peer& P = peers[p];
  P.in_payload = false;
  if (P.hdr.type == kAbort) {
    report(DOPT_ERR_COMM, std::string(P.heap.begin(), P.heap.end()), false);
  } else {
    sdk::metric_add("comm.bytes_received", static_cast<double>(P.hdr.len));
    if (P.rx_req) {
      if (P.want_len)
        fail_req(P.rx_req, DOPT_ERR_INVALID_ARGUMENT,
                 mismatch(p, P.hdr.tag, P.hdr.len, P.want_len - 1));
      else
        P.rx_req->complete(DOPT_OK);
      P.rx_req.reset();
    } else {
      deliver_unmatched(p);
    }
  }
  P.heap = std::vector<char>();
}

void ControlChannel::State::deliver_unmatched(int p) {
  Peer& P = peers[p];
  for (auto it = P.posted.begin(); it != P.posted.end(); ++it) {
    if (it->tag != P.hdr.tag) continue;
    if (it->len == P.heap.size()) {
      if (it->len) std::memcpy(it->dst, P.heap.data(), it->len);
      it->req->complete(DOPT_OK);
    } else {
      fail_req(it->req, DOPT_ERR_INVALID_ARGUMENT, mismatch(p, P.hdr.tag, P.heap.size(), it->len));
    }
    P.posted.erase(it);
    return;
  }
  P.unexpected.push_back(Unexpected{P.hdr.tag, std::move(P.heap)});
}

void ControlChannel::State::check_deadlines(const ControlChannel& c) {
  const auto now = Clock::now();
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    Peer& P = peers[p];
    for (auto it = P.posted.begin(); it != P.posted.end();) {
      if (now < it->deadline) {
        ++it;
        continue;
      }
      const std::string silent = c.silence();
      fail_req(it->req, DOPT_ERR_TIMEOUT,
               "timed out waiting for a message from rank " + std::to_string(p) + " (tag " +
                   std::to_string(it->tag) + ")" + (silent.empty() ? "" : "; " + silent));
      it = P.posted.erase(it);
    }
    if (failed || stopping) continue;
    if (!P.tx.empty() && now >= P.tx.front().deadline)
      report(DOPT_ERR_TIMEOUT, "timed out sending to rank " + std::to_string(p), true);
    else if (P.in_payload && now >= P.rx_deadline)
      report(DOPT_ERR_TIMEOUT, "timed out receiving a message from rank " + std::to_string(p),
             true);
  }
}

void ControlChannel::State::run(const ControlChannel& c) {
  while (true) {
    for (auto& cmd : take_commands()) {
      switch (cmd.kind) {
        case Cmd::Send:
          on_send_cmd(cmd);
          break;
        case Cmd::Recv:
          on_recv_cmd(cmd);
          break;
        case Cmd::Fail:
          on_fail_cmd(cmd);
          break;
        case Cmd::Stop:
          on_stop_cmd();
          break;
      }
    }
    if (stopping && stop_done()) return;
    wait_io(keep_alive());
    for (size_t i = 1; i < pfds.size(); ++i) {
      const int p = peer_of[i];
      const short rev = pfds[i].revents;
      if (rev & (POLLOUT | POLLERR | POLLHUP)) on_writable(p);
      if (rev & (POLLIN | POLLERR | POLLHUP)) on_readable(p);
    }
    check_deadlines(c);
  }
}

ControlChannel::ControlChannel(TcpComm* comm, int rank, std::vector<int> fds)
    : comm_(comm), st_(new State) {
  st_->comm = comm;
  st_->rank = rank;
  st_->timeout_s = comm->timeout_s();
  st_->timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(comm->timeout_s()));
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

ControlChannel::~ControlChannel() {
  if (thread_.joinable()) stop();
  if (st_->wake_fd >= 0) close(st_->wake_fd);
}

bool ControlChannel::said_bye(int peer) const { return st_->bye[peer].load(); }
const std::atomic<bool>* ControlChannel::bye_flags() const { return st_->bye.data(); }

std::string ControlChannel::silence() const {
  const int64_t now = now_ns();
  const int64_t limit =
      3 * std::chrono::duration_cast<std::chrono::nanoseconds>(st_->ping_every).count();
  std::string silent;  // "1, 3"
  int count = 0;
  int64_t least = INT64_MAX;
  for (size_t p = 0; p < st_->last_heard_ns.size(); ++p) {
    if (static_cast<int>(p) == st_->rank || st_->bye[p]) continue;
    const int64_t quiet = now - st_->last_heard_ns[p].load();
    if (quiet <= limit) continue;
    silent += (count++ ? ", " : "") + std::to_string(p);
    least = std::min(least, quiet);
  }
  if (!count) return "";
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(least) / 1e9);
  return (count > 1 ? "ranks " : "rank ") + silent + " silent for " + secs +
         " s (unreachable, or stopped)";
}

void ControlChannel::wake() {
  uint64_t one = 1;
  (void)!write(st_->wake_fd, &one, sizeof one);
}

void ControlChannel::post_send(int peer, int tag, const char* data, size_t len,
                               std::shared_ptr<sdk::Completion> req) {
  Cmd c(Cmd::Send);
  c.peer = peer, c.tag = tag, c.data = const_cast<char*>(data), c.len = len, c.req = std::move(req);
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(std::move(c));
  }
  wake();
}

void ControlChannel::post_recv(int peer, int tag, char* data, size_t len,
                               std::shared_ptr<sdk::Completion> req) {
  Cmd c(Cmd::Recv);
  c.peer = peer, c.tag = tag, c.data = data, c.len = len, c.req = std::move(req);
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(std::move(c));
  }
  wake();
}

void ControlChannel::on_failure(dopt_status status, const std::string& cause, bool notify) {
  Cmd c(Cmd::Fail);
  c.status = status, c.cause = cause, c.notify = notify;
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(std::move(c));
  }
  wake();
}

void ControlChannel::stop() {
  {
    std::lock_guard<std::mutex> lk(st_->mu);
    st_->inbox.push_back(Cmd(Cmd::Stop));
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

void ControlChannel::loop() { st_->run(*this); }

}  // namespace distopt::plugins::tcp
