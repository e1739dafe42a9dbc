// tcp:// rendezvous store (server on rank 0, client on every rank).
//
// Wire format: frames of u32 length + payload (store/net.hpp). Requests start
// with an opcode byte; replies with a status byte. The first request of every
// connection is HELLO carrying the job token.
#include "store/tcp_store.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "store/net.hpp"

namespace distopt::store {
namespace {

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kCheck = 5 };
enum Reply : uint8_t { kOk = 0, kMissing = 1, kRefused = 2, kBad = 3 };

constexpr const char* kMagic = "distopt-store-v1";

std::vector<uint8_t> reply(uint8_t status, const std::vector<uint8_t>& body = {}) {
  std::vector<uint8_t> r;
  put_u8(r, status);
  r.insert(r.end(), body.begin(), body.end());
  return r;
}

}  // namespace

// ----------------------------------------------------------------- server ---

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string token)
    : token_(std::move(token)) {
  listen_fd_ = listen_on(host, port, &port_);
  if (pipe(wake_) != 0) {
    close(listen_fd_);
    throw RendezvousError("store server: pipe failed");
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  char c = 1;
  (void)!write(wake_[1], &c, 1);
  if (acceptor_.joinable()) acceptor_.join();
  {
    // Only the read side: a request being answered still gets its reply,
    // then the worker sees EOF and ends.
    std::lock_guard<std::mutex> lk(mu_);
    for (int fd : client_fds_)
      if (fd >= 0) shutdown(fd, SHUT_RD);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void TcpStoreServer::accept_loop() {
  while (!stop_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents) break;
    if (!(p[0].revents & POLLIN)) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // Replies are small: without this, Nagle holds each one until the
    // client's delayed ACK (about 40 ms per request on Linux).
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lk(mu_);
    client_fds_.push_back(fd);
    ++live_;
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  std::string who = peer_name(fd);
  std::string err;
  std::vector<uint8_t> req;
  // Handshake: the first frame must be HELLO + magic + the job token. A short
  // deadline keeps a silent stranger from holding a thread.
  bool ok = read_frame(fd, req, Clock::now() + std::chrono::seconds(10), &err);
  if (ok) {
    Reader r{req};
    uint8_t op = r.u8();
    std::string magic = r.str();
    std::string token = r.str();
    if (!r.ok || op != kHello || magic != kMagic) {
      err = "malformed first frame (not a distopt store client)";
      ok = false;
    } else if (token != token_) {
      err = "wrong job token";
      ok = false;
    }
  }
  if (!ok) {
    log(DOPT_LOG_WARN, "store", "refused connection from " + who + ": " + err);
    write_frame(fd, reply(kRefused), Clock::now() + std::chrono::seconds(1), nullptr);
  } else {
    write_frame(fd, reply(kOk), Clock::now() + std::chrono::seconds(10), nullptr);
    while (!stop_) {
      // Clients may idle for as long as they like between requests.
      if (!read_frame(fd, req, Clock::time_point::max(), &err)) {
        if (err != "connection closed by peer" && !stop_)
          log(DOPT_LOG_WARN, "store", "dropping client " + who + ": " + err);
        break;
      }
      bool close_conn = false;
      auto rep = handle(req, &close_conn);
      if (!write_frame(fd, rep, Clock::now() + std::chrono::seconds(60), &err) || close_conn) break;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& c : client_fds_)
    if (c == fd) c = -1;
  close(fd);
  --live_;
  gone_cv_.notify_all();
}

int TcpStoreServer::linger(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lk(mu_);
  gone_cv_.wait_for(lk, bound, [&] { return live_ == 0; });
  return live_;
}

std::vector<uint8_t> TcpStoreServer::handle(const std::vector<uint8_t>& req, bool* close_conn) {
  Reader r{req};
  uint8_t op = r.u8();
  std::string key = r.str();
  std::unique_lock<std::mutex> lk(mu_);
  switch (op) {
    case kSet: {
      auto v = r.bytes();
      if (!r.ok) break;
      data_[key] = std::move(v);
      cv_.notify_all();
      return reply(kOk);
    }
    case kGet: {
      int64_t wait_ms = r.i64();
      if (!r.ok) break;
      auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0));
      bool found = cv_.wait_until(lk, deadline, [&] { return stop_ || data_.count(key) != 0; });
      if (!found || stop_) return reply(kMissing);
      std::vector<uint8_t> body;
      put_bytes(body, data_[key].data(), data_[key].size());
      return reply(kOk, body);
    }
    case kAdd: {
      int64_t delta = r.i64();
      if (!r.ok) break;
      auto& v = data_[key];
      int64_t cur = 0;
      try {
        if (!v.empty()) cur = std::stoll(std::string(v.begin(), v.end()));
      } catch (const std::exception&) {
        return reply(kBad);  // the key holds something that is not a counter
      }
      cur += delta;
      std::string s = std::to_string(cur);
      v.assign(s.begin(), s.end());
      cv_.notify_all();
      std::vector<uint8_t> body;
      put_i64(body, cur);
      return reply(kOk, body);
    }
    case kCheck:
      if (!r.ok) break;
      return reply(data_.count(key) ? kOk : kMissing);
    default:
      break;
  }
  *close_conn = true;
  return reply(kBad);
}

// ----------------------------------------------------------------- client ---

TcpStore::TcpStore(const std::string& host, int port, const StoreOptions& opts)
    : timeout_(opts.timeout) {
  if (opts.rank == 0 && opts.serve) {
    server_ = std::make_unique<TcpStoreServer>(host, port, opts.token);
    port = server_->port();
  }
  where_ = host + ":" + std::to_string(port);
  auto deadline = Clock::now() + opts.timeout;
  std::string err;
  // The server may not be up yet: retry with a short back-off until the timeout.
  auto backoff = std::chrono::milliseconds(10);
  while ((fd_ = connect_to(host, port, &err)) < 0) {
    if (Clock::now() + backoff > deadline)
      throw RendezvousError("cannot connect to the rendezvous store at " + where_ + " within " +
                            std::to_string(opts.timeout.count()) + " ms: " + err);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  std::vector<uint8_t> hello;
  put_u8(hello, kHello);
  put_str(hello, kMagic);
  put_str(hello, opts.token);
  std::vector<uint8_t> rep;
  if (!write_frame(fd_, hello, deadline, &err) || !read_frame(fd_, rep, deadline, &err) ||
      rep.empty() || rep[0] != kOk) {
    close(fd_);
    fd_ = -1;
    bool refused = !rep.empty() && rep[0] == kRefused;
    throw RendezvousError("rendezvous store at " + where_ + " refused this client" +
                          (refused ? ": wrong job token (check DISTOPT_JOB_TOKEN)" : ": " + err));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) close(fd_);
  if (!server_) return;
  // The hosting rank may finish first (or fail first) while the others
  // still read what it left in the store: the posts that name a collective
  // mismatch, its "left" post. Serve them until they disconnect, within a
  // bound, instead of cutting them off mid-request.
  const int still = server_->linger(kServerLinger);
  if (still > 0)
    log(DOPT_LOG_INFO, "store",
        "closing the rendezvous store with " + std::to_string(still) +
            " rank(s) still connected after " + std::to_string(kServerLinger.count()) + " ms");
  server_.reset();
}

std::vector<uint8_t> TcpStore::call(const std::vector<uint8_t>& req, std::chrono::milliseconds wait,
                                    const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  if (fd_ < 0)
    throw RendezvousError("rendezvous store at " + where_ + ": connection is closed" +
                          (closed_by_.empty() ? "" : " since " + closed_by_));
  std::string err;
  // The server answers a get within `wait`; allow for scheduling on top.
  auto deadline = Clock::now() + wait + std::max(timeout_, std::chrono::milliseconds(5000));
  std::vector<uint8_t> rep;
  if (!write_frame(fd_, req, deadline, &err) || !read_frame(fd_, rep, deadline, &err) ||
      rep.empty()) {
    close(fd_);
    fd_ = -1;
    closed_by_ = what + " failed: " + err;
    throw RendezvousError("rendezvous store at " + where_ + ": " + closed_by_);
  }
  if (rep[0] == kBad || rep[0] == kRefused)
    throw RendezvousError("rendezvous store at " + where_ + ": " + what +
                          " rejected by the server");
  return rep;
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> req;
  put_u8(req, kSet);
  put_str(req, key);
  put_bytes(req, value.data(), value.size());
  call(req, std::chrono::milliseconds(0), "set '" + key + "'");
}

std::vector<uint8_t> TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> req;
  put_u8(req, kGet);
  put_str(req, key);
  put_i64(req, timeout.count());
  auto rep = call(req, timeout, "get '" + key + "'");
  if (rep[0] == kMissing)
    throw RendezvousError("rendezvous store: timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for key '" + key + "'");
  Reader r{rep, 1};
  auto v = r.bytes();
  if (!r.ok) throw RendezvousError("rendezvous store: malformed reply to get '" + key + "'");
  return v;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::vector<uint8_t> req;
  put_u8(req, kAdd);
  put_str(req, key);
  put_i64(req, delta);
  auto rep = call(req, std::chrono::milliseconds(0), "add '" + key + "'");
  Reader r{rep, 1};
  int64_t v = r.i64();
  if (!r.ok) throw RendezvousError("rendezvous store: malformed reply to add '" + key + "'");
  return v;
}

bool TcpStore::check(const std::string& key) {
  std::vector<uint8_t> req;
  put_u8(req, kCheck);
  put_str(req, key);
  return call(req, std::chrono::milliseconds(0), "check '" + key + "'")[0] == kOk;
}

}  // namespace distopt::store
