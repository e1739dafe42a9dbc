// Source-address filters on listening sockets (classic BPF).
#include "listener_filter.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace distopt::plugins::ucx {

std::vector<uint32_t> local_ipv4_addresses() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
      out.push_back(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
  freeifaddrs(list);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> listening_tcp4_fds() {
  std::vector<int> out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end || fd == dirfd(d)) continue;
    struct stat st {};
    int listening = 0, domain = 0, protocol = 0;
    socklen_t len = sizeof(int);
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        !listening)
      continue;
    len = sizeof(int);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
        domain != AF_INET)
      continue;
    len = sizeof(int);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
        protocol != IPPROTO_TCP)
      continue;
    out.push_back(static_cast<int>(fd));
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool allow_sources(int fd, const std::vector<uint32_t>& allowed) {
  if (allowed.size() > 2000) {  // 2 instructions each, BPF_MAXINSNS = 4096
    errno = E2BIG;
    return false;
  }
  // A = the IPv4 source (loads are big-endian); accept on a match, else drop.
  std::vector<sock_filter> prog;
  prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF + 12)));
  for (uint32_t a : allowed) {
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ntohl(a), 0, 1));
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, 0xffffffffu));
  }
  prog.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
  sock_fprog f{static_cast<unsigned short>(prog.size()), prog.data()};
  return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &f, sizeof f) == 0;
}

}  // namespace distopt::plugins::ucx
