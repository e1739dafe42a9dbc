// Source-address filters on UCX's listening TCP sockets. UCX 1.13's tcp
// transport accepts a connection from anyone on its worker's ports, lets
// any connected worker send tagged messages, and aborts the whole process
// on a malformed stream (tcp_ep.c: "hdr->length <= rx_seg_size" assertion,
// measured: tests/netns/netns_test.py). UCP offers no hook to refuse
// connections, so UcpTransport attaches a classic BPF socket filter to the
// listening sockets its worker opened: every packet (the SYN included)
// whose IPv4 source is not one of the job's hosts' addresses is dropped
// before TCP sees it, so a stranger on another host never connects.
// Accepted connections inherit the filter. IPv6 listeners are left alone.
// Thread safety: none needed (plain system calls), but the listeners a
// worker opened are found by comparing /proc/self/fd before and after its
// creation: do not create listening sockets on other threads meanwhile.
#pragma once

#include <cstdint>
#include <vector>

namespace distopt::plugins::ucx {

/// This host's IPv4 addresses (getifaddrs), network byte order, sorted,
/// without duplicates. Empty if getifaddrs fails.
std::vector<uint32_t> local_ipv4_addresses();

/// The file descriptors of this process's listening AF_INET TCP sockets.
std::vector<int> listening_tcp4_fds();

/// Make listening socket `fd` drop every packet whose IPv4 source address
/// is not in `allowed` (network byte order; at most 2000 addresses),
/// replacing the filter it had. Returns false (errno set) when the kernel
/// refuses the filter or `allowed` is too long.
bool allow_sources(int fd, const std::vector<uint32_t>& allowed);

}  // namespace distopt::plugins::ucx
