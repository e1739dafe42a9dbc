// POSIX TCP socket helpers.
#include "socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "distopt/sdk/transport/socket_io.hpp"

namespace distopt::plugins::tcp {
namespace {

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    throw std::runtime_error("cannot resolve '" + host + "': " + gai_strerror(rc));
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

}  // namespace

void set_nonblocking(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_buffers(int fd, const SocketOptions& so) {
  if (so.buffer_bytes <= 0) return;
  int v = static_cast<int>(so.buffer_bytes);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
}

int listen_any(const std::string& host, const SocketOptions& so, int* port) {
  sockaddr_in a = resolve(host, 0);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  set_buffers(fd, so);  // accepted sockets inherit the buffer sizes (needed before the handshake
                        // for window scaling)
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 256) != 0) {
    int e = errno;
    close(fd);
    throw std::runtime_error("cannot listen on " + host + ": " + std::strerror(e));
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

int connect_retry(const std::string& host, int port, const SocketOptions& so,
                  Clock::time_point deadline) {
  sockaddr_in a = resolve(host, port);
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    set_buffers(fd, so);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      set_nodelay(fd);
      return fd;
    }
    int e = errno;
    close(fd);
    if (Clock::now() + backoff > deadline)
      throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port) + ": " +
                               std::strerror(e));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

int accept_until(int listen_fd, Clock::time_point deadline) {
  while (true) {
    pollfd p{listen_fd, POLLIN, 0};
    int t = poll_ms(deadline, 1000);
    int r = poll(&p, 1, t);
    if (r > 0) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        set_nodelay(fd);
        return fd;
      }
    }
    if (Clock::now() >= deadline) return -1;
  }
}

int poll_ms(Clock::time_point deadline, int cap_ms) {
  return sdk::socket_io::poll_ms(deadline, cap_ms);
}

namespace {
// The handshake's wording of a transfer's end.
bool said(sdk::socket_io::IoStatus st, int err, std::string* why) {
  using sdk::socket_io::IoStatus;
  if (st == IoStatus::kOk) return true;
  *why = st == IoStatus::kTimeout  ? "timed out"
         : st == IoStatus::kClosed ? "connection closed"
                                   : std::strerror(err);
  return false;
}
}  // namespace

bool send_exact(int fd, const void* p, size_t n, Clock::time_point deadline, std::string* why) {
  int err = 0;
  return said(sdk::socket_io::send_all(fd, p, n, deadline, &err), err, why);
}

bool recv_exact(int fd, void* p, size_t n, Clock::time_point deadline, std::string* why) {
  int err = 0;
  return said(sdk::socket_io::recv_all(fd, p, n, deadline, &err), err, why);
}

std::string peer_address(int fd) { return sdk::socket_io::peer_address(fd); }

}  // namespace distopt::plugins::tcp
