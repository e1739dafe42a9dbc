// Full-mesh connection setup through the rendezvous store.
#include "mesh.hpp"

#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "distopt/sdk/base/host.hpp"

namespace distopt::plugins::tcp {
namespace {

constexpr char kMagic[8] = {'D', 'O', 'P', 'T', 'T', 'C', 'P', '1'};
constexpr uint32_t kMaxString = 4096;  // token and prefix length limit (length-checked hello)
constexpr char kAccept = 'K';

std::string store_get_string(const MeshArgs& a, const std::string& key) {
  char buf[512];
  size_t len = 0;
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(a.deadline - Clock::now()).count();
  dopt_status st =
      sdk::host()->store_get(a.store, key.c_str(), buf, sizeof buf, &len, left > 0 ? left : 0);
  if (st != DOPT_OK)
    throw std::runtime_error("rendezvous: no address under '" + key + "' (" +
                             dopt_status_string(st) + ")");
  if (len > sizeof buf) throw std::runtime_error("rendezvous: value of '" + key + "' is too long");
  return std::string(buf, len);
}

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }

std::string hello(const MeshArgs& a, uint8_t channel) {
  std::string h(kMagic, 8);
  put_u32(h, static_cast<uint32_t>(a.token.size()));
  h += a.token;
  put_u32(h, static_cast<uint32_t>(a.prefix.size()));
  h += a.prefix;
  put_u32(h, static_cast<uint32_t>(a.rank));
  h.push_back(static_cast<char>(channel));
  return h;
}

// Reads and checks a hello; returns "" when valid, else why it is refused.
std::string read_hello(int fd, const MeshArgs& a, int* peer, int* channel) {
  auto dl = std::min(a.deadline, Clock::now() + std::chrono::seconds(5));
  std::string why;
  char magic[8];
  if (!recv_exact(fd, magic, 8, dl, &why)) return "no hello (" + why + ")";
  if (std::memcmp(magic, kMagic, 8) != 0) return "not a distopt tcp peer (bad magic)";
  auto read_string = [&](std::string& out) -> bool {
    uint32_t n = 0;
    if (!recv_exact(fd, &n, 4, dl, &why)) return false;
    if (n > kMaxString) {
      why = "oversized field (" + std::to_string(n) + " bytes)";
      return false;
    }
    out.resize(n);
    return recv_exact(fd, out.data(), n, dl, &why);
  };
  std::string token, prefix;
  if (!read_string(token)) return "truncated hello: " + why;
  if (token != a.token) return "wrong job token";
  if (!read_string(prefix)) return "truncated hello: " + why;
  if (prefix != a.prefix) return "hello for another communicator ('" + prefix + "')";
  uint32_t r = 0;
  uint8_t ch = 0;
  if (!recv_exact(fd, &r, 4, dl, &why) || !recv_exact(fd, &ch, 1, dl, &why))
    return "truncated hello: " + why;
  if (static_cast<int>(r) <= a.rank || static_cast<int>(r) >= a.world_size || ch > 2)
    return "unexpected rank " + std::to_string(r) + " / channel " + std::to_string(ch);
  *peer = static_cast<int>(r);
  *channel = ch;
  return "";
}

}  // namespace

void Mesh::close_all() {
  for (auto* v : {&out, &in, &ctrl})
    for (int& fd : *v)
      if (fd >= 0) {
        ::close(fd);
        fd = -1;
      }
}

Mesh build_mesh(const MeshArgs& a) {
  Mesh m;
  m.out.assign(a.world_size, -1);
  m.in.assign(a.world_size, -1);
  m.ctrl.assign(a.world_size, -1);
  // Channels, named from the connecting (higher) rank's side:
  // 0 = its outgoing data, 1 = control, 2 = its incoming data.
  auto slot = [&](int ch, bool connector, int peer) -> int& {
    if (ch == 1) return m.ctrl[peer];
    bool outgoing = (ch == 0) == connector;
    return outgoing ? m.out[peer] : m.in[peer];
  };
  if (a.world_size == 1) return m;
  int port = 0;
  int lfd = listen_any(a.bind_address, a.sockets, &port);
  try {
    std::string me = a.bind_address + ":" + std::to_string(port);
    std::string key = a.prefix + "/tcp/addr/" + std::to_string(a.rank);
    if (sdk::host()->store_set(a.store, key.c_str(), me.data(), me.size()) != DOPT_OK)
      throw std::runtime_error("rendezvous: cannot publish this rank's address under '" + key +
                               "'");

    // Lower ranks: connect (they accept in any order; the backlog holds us).
    for (int p = 0; p < a.rank; ++p) {
      std::string addr = store_get_string(a, a.prefix + "/tcp/addr/" + std::to_string(p));
      auto colon = addr.rfind(':');
      std::string host = addr.substr(0, colon);
      int pport = std::atoi(addr.c_str() + colon + 1);
      for (uint8_t ch = 0; ch < 3; ++ch) {
        int fd = connect_retry(host, pport, a.sockets, a.deadline);
        std::string h = hello(a, ch), why;
        char ack = 0;
        if (!send_exact(fd, h.data(), h.size(), a.deadline, &why) ||
            !recv_exact(fd, &ack, 1, a.deadline, &why) || ack != kAccept) {
          ::close(fd);
          throw std::runtime_error("rank " + std::to_string(p) + " at " + addr +
                                   " refused the connection (" + (why.empty() ? "bad reply" : why) +
                                   ")");
        }
        slot(ch, true, p) = fd;
      }
    }
    // Higher ranks: accept until each has all three channels.
    int need = 3 * (a.world_size - 1 - a.rank);
    while (need > 0) {
      int fd = accept_until(lfd, a.deadline);
      if (fd < 0) {
        // Name the ranks, not the sockets (each rank opens three).
        std::string missing;
        for (int p = a.rank + 1; p < a.world_size; ++p)
          for (uint8_t c = 0; c < 3; ++c)
            if (slot(c, false, p) < 0) {
              missing += (missing.empty() ? "" : ", ") + std::to_string(p);
              break;
            }
        throw std::runtime_error("timed out waiting for rank(s) " + missing + " to connect");
      }
      int peer = -1, ch = -1;
      std::string why = read_hello(fd, a, &peer, &ch);
      if (why.empty() && slot(ch, false, peer) >= 0)
        why = "duplicate connection from rank " + std::to_string(peer);
      if (!why.empty()) {
        sdk::log_warn("tcp", "refused connection from " + peer_address(fd) + ": " + why);
        ::close(fd);
        continue;
      }
      std::string w;
      if (!send_exact(fd, &kAccept, 1, a.deadline, &w)) {
        ::close(fd);
        throw std::runtime_error("rank " + std::to_string(peer) +
                                 " dropped its connection during the handshake");
      }
      slot(ch, false, peer) = fd;
      --need;
    }
  } catch (...) {
    ::close(lfd);
    m.close_all();
    throw;
  }
  ::close(lfd);
  for (int p = 0; p < a.world_size; ++p) {
    if (p == a.rank) continue;
    set_nonblocking(m.out[p], true);
    set_nonblocking(m.in[p], true);
    set_nonblocking(m.ctrl[p], true);
  }
  return m;
}

}  // namespace distopt::plugins::tcp
