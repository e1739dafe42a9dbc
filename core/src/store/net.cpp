// Blocking-socket helpers for the TCP store (poll-based deadlines).
#include "store/net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "distopt/error.hpp"
#include "distopt/sdk/transport/socket_io.hpp"

namespace distopt::store {

void split_host_port(const std::string& hp, std::string& host, int& port) {
  auto colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size())
    throw RendezvousError("rendezvous address '" + hp + "' is not HOST:PORT");
  host = hp.substr(0, colon);
  char* end = nullptr;
  long p = std::strtol(hp.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535)
    throw RendezvousError("rendezvous address '" + hp + "' has an invalid port");
  port = static_cast<int>(p);
}

static bool resolve(const std::string& host, int port, sockaddr_in* out, std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    if (err) *err = "cannot resolve host '" + host + "': " + gai_strerror(rc);
    return false;
  }
  *out = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  out->sin_port = htons(static_cast<uint16_t>(port));
  freeaddrinfo(res);
  return true;
}

int listen_on(const std::string& host, int port, int* bound_port) {
  sockaddr_in addr{};
  std::string err;
  if (!resolve(host, port, &addr, &err)) throw RendezvousError("store server: " + err);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RendezvousError(std::string("store server: socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 128) != 0) {
    int e = errno;
    close(fd);
    throw RendezvousError("store server: cannot listen on " + host + ":" + std::to_string(port) +
                          ": " + std::strerror(e));
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (bound_port) *bound_port = ntohs(addr.sin_port);
  return fd;
}

int connect_to(const std::string& host, int port, std::string* err) {
  sockaddr_in addr{};
  if (!resolve(host, port, &addr, err)) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (err) *err = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (err) *err = std::string(std::strerror(errno));
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool write_all(int fd, const void* p, size_t n, Clock::time_point deadline, std::string* err) {
  using sdk::socket_io::IoStatus;
  int e = 0;
  const IoStatus st = sdk::socket_io::send_all(fd, p, n, deadline, &e);
  if (st == IoStatus::kOk) return true;
  if (err)
    *err = st == IoStatus::kTimeout ? "timed out sending"
                                    : std::string("send failed: ") + std::strerror(e);
  return false;
}

bool read_all(int fd, void* p, size_t n, Clock::time_point deadline, std::string* err) {
  using sdk::socket_io::IoStatus;
  int e = 0;
  const IoStatus st = sdk::socket_io::recv_all(fd, p, n, deadline, &e);
  if (st == IoStatus::kOk) return true;
  if (err)
    *err = st == IoStatus::kTimeout  ? "timed out waiting for a reply"
           : st == IoStatus::kClosed ? "connection closed by peer"
                                     : std::string("recv failed: ") + std::strerror(e);
  return false;
}

bool write_frame(int fd, const std::vector<uint8_t>& payload, Clock::time_point deadline,
                 std::string* err) {
  // One buffer, one segment for a small frame (header and payload together).
  const uint32_t len = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> frame;
  frame.reserve(4 + payload.size());
  frame.insert(frame.end(),
               {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)});
  frame.insert(frame.end(), payload.begin(), payload.end());
  return write_all(fd, frame.data(), frame.size(), deadline, err);
}

bool read_frame(int fd, std::vector<uint8_t>& payload, Clock::time_point deadline,
                std::string* err) {
  uint8_t hdr[4];
  if (!read_all(fd, hdr, 4, deadline, err)) return false;
  uint32_t len =
      uint32_t(hdr[0]) | uint32_t(hdr[1]) << 8 | uint32_t(hdr[2]) << 16 | uint32_t(hdr[3]) << 24;
  if (len > kMaxFrame) {
    if (err)
      *err = "frame of " + std::to_string(len) + " bytes exceeds the limit of " +
             std::to_string(kMaxFrame);
    return false;
  }
  payload.resize(len);
  return read_all(fd, payload.data(), len, deadline, err);
}

std::string peer_name(int fd) { return sdk::socket_io::peer_address(fd); }

void put_u8(std::vector<uint8_t>& b, uint8_t v) { b.push_back(v); }
void put_i64(std::vector<uint8_t>& b, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(u >> (8 * i)));
}
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  uint32_t len = static_cast<uint32_t>(n);
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(len >> (8 * i)));
  const auto* c = static_cast<const uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}
void put_str(std::vector<uint8_t>& b, const std::string& s) { put_bytes(b, s.data(), s.size()); }

uint8_t Reader::u8() {
  if (pos + 1 > b.size()) {
    ok = false;
    return 0;
  }
  return b[pos++];
}
int64_t Reader::i64() {
  if (pos + 8 > b.size()) {
    ok = false;
    return 0;
  }
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= uint64_t(b[pos + i]) << (8 * i);
  pos += 8;
  return static_cast<int64_t>(u);
}
std::vector<uint8_t> Reader::bytes() {
  if (pos + 4 > b.size()) {
    ok = false;
    return {};
  }
  uint32_t len = uint32_t(b[pos]) | uint32_t(b[pos + 1]) << 8 | uint32_t(b[pos + 2]) << 16 |
                 uint32_t(b[pos + 3]) << 24;
  pos += 4;
  if (len > b.size() - pos) {
    ok = false;
    return {};
  }
  std::vector<uint8_t> v(b.begin() + pos, b.begin() + pos + len);
  pos += len;
  return v;
}
std::string Reader::str() {
  auto v = bytes();
  return std::string(v.begin(), v.end());
}

}  // namespace distopt::store
