// Thin POSIX TCP socket helpers: listen/connect, options, and blocking
// transfers with a deadline (used for the connection handshake only; the
// collectives drive non-blocking sockets themselves).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace distopt::plugins::tcp {

using Clock = std::chrono::steady_clock;

/// Socket tuning applied to every data connection.
struct SocketOptions {
  int64_t buffer_bytes = 0;  ///< SO_SNDBUF/SO_RCVBUF; 0 = kernel autotuning
};

/// Listen on host:0 (any free port). Returns the fd; *port gets the port.
/// Throws std::runtime_error naming the address.
int listen_any(const std::string& host, const SocketOptions& so, int* port);
/// Connect to host:port, retrying refused connections until `deadline`.
/// Throws std::runtime_error naming the address.
int connect_retry(const std::string& host, int port, const SocketOptions& so,
                  Clock::time_point deadline);
/// Accept one connection, waiting until `deadline`; -1 on timeout.
int accept_until(int listen_fd, Clock::time_point deadline);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
void set_buffers(int fd, const SocketOptions& so);

/// Blocking-with-deadline exact transfers; false on EOF/error/timeout, with *why.
bool send_exact(int fd, const void* p, size_t n, Clock::time_point deadline, std::string* why);
bool recv_exact(int fd, void* p, size_t n, Clock::time_point deadline, std::string* why);

/// Milliseconds until deadline for poll(), clamped to [0, cap_ms].
int poll_ms(Clock::time_point deadline, int cap_ms);

/// "ip:port" of the peer, for log messages.
std::string peer_address(int fd);

}  // namespace distopt::plugins::tcp
