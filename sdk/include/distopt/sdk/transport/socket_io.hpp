// Deadline-bounded exact transfers on a stream socket (POSIX), shared by the
// host's TCP store (core/src/store/net.cpp) and the tcp communicator's
// connection handshake (plugins/tcp/socket.cpp). Each caller words its own
// messages from the IoStatus. Also the peer address both log. Header-only,
// torch-free.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>

namespace distopt::sdk::socket_io {

using Clock = std::chrono::steady_clock;

/// How a transfer ended.
enum class IoStatus {
  kOk,       ///< all n bytes moved
  kClosed,   ///< the peer closed the connection (recv returned 0)
  kTimeout,  ///< the deadline passed first
  kError,    ///< send/recv failed; the errno is in *err
};

/// Milliseconds until `deadline` for poll(), clamped to [0, cap_ms]; rounded
/// up so that a poll does not wake just before the deadline and spin.
inline int poll_ms(Clock::time_point deadline, int cap_ms) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > cap_ms ? cap_ms : static_cast<int>(left) + 1;
}

namespace detail {
/// One loop for both directions: `io` is one non-blocking send or recv.
template <class Io>
IoStatus transfer(int fd, char* p, size_t n, short event, Clock::time_point deadline, int* err,
                  Io io) {
  while (n > 0) {
    const ssize_t k = io(fd, p, n);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0 && event == POLLIN) return IoStatus::kClosed;
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() >= deadline) return IoStatus::kTimeout;
      pollfd pf{fd, event, 0};
      poll(&pf, 1, poll_ms(deadline, 1000));  // at most 1 s: the deadline is checked again
      continue;
    }
    if (err) *err = k < 0 ? errno : EPIPE;
    return IoStatus::kError;
  }
  return IoStatus::kOk;
}
}  // namespace detail

/// Send exactly `n` bytes at `p` on socket `fd` (blocking or not: each call
/// is MSG_DONTWAIT, waits are poll()s) before `deadline`
/// (Clock::time_point::max(): no limit). Never raises SIGPIPE. Thread-safe
/// for distinct fds.
inline IoStatus send_all(int fd, const void* p, size_t n, Clock::time_point deadline,
                         int* err = nullptr) {
  return detail::transfer(
      fd, static_cast<char*>(const_cast<void*>(p)), n, POLLOUT, deadline, err,
      [](int f, char* b, size_t m) { return ::send(f, b, m, MSG_NOSIGNAL | MSG_DONTWAIT); });
}

/// Receive exactly `n` bytes into `p` from socket `fd` before `deadline`,
/// as send_all.
inline IoStatus recv_all(int fd, void* p, size_t n, Clock::time_point deadline,
                         int* err = nullptr) {
  return detail::transfer(fd, static_cast<char*>(p), n, POLLIN, deadline, err,
                          [](int f, char* b, size_t m) { return ::recv(f, b, m, MSG_DONTWAIT); });
}

/// "ip:port" of the remote end of IPv4 socket `fd` ("?" when unknown), for
/// log messages.
inline std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

}  // namespace distopt::sdk::socket_io
