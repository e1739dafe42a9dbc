// Small blocking-socket helpers shared by the TCP store's client and server.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace distopt::store {

using Clock = std::chrono::steady_clock;

/// Split "HOST:PORT" (IPv4 name or address); throws RendezvousError.
void split_host_port(const std::string& hp, std::string& host, int& port);

/// Listening socket bound to host:port (port 0 = any); returns fd, sets *bound_port.
int listen_on(const std::string& host, int port, int* bound_port);
/// Connect once; returns fd or -1 (errno-style message in *err).
int connect_to(const std::string& host, int port, std::string* err);

/// Send/receive exactly n bytes before `deadline`; false on EOF, error or timeout
/// (then *err says which).
bool write_all(int fd, const void* p, size_t n, Clock::time_point deadline, std::string* err);
bool read_all(int fd, void* p, size_t n, Clock::time_point deadline, std::string* err);

/// Frames: u32 little-endian length, then that many bytes (at most kMaxFrame).
constexpr uint32_t kMaxFrame = 64u << 20;
bool write_frame(int fd, const std::vector<uint8_t>& payload, Clock::time_point deadline,
                 std::string* err);
bool read_frame(int fd, std::vector<uint8_t>& payload, Clock::time_point deadline,
                std::string* err);

/// "ip:port" of the remote end of fd, for log messages.
std::string peer_name(int fd);

/// Serialisation of store messages: strings and integers appended to a byte vector.
void put_u8(std::vector<uint8_t>& b, uint8_t v);
void put_i64(std::vector<uint8_t>& b, int64_t v);
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n);  // u32 length + bytes
void put_str(std::vector<uint8_t>& b, const std::string& s);

/// Reads fields from a received frame; any overrun sets ok = false.
struct Reader {
  const std::vector<uint8_t>& b;
  size_t pos = 0;
  bool ok = true;
  uint8_t u8();
  int64_t i64();
  std::vector<uint8_t> bytes();
  std::string str();
};

}  // namespace distopt::store
