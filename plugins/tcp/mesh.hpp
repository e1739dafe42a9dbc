// Establishing the full mesh: every pair of ranks gets two one-way data connections
// (raw collective streams) and a control connection (framed send / recv messages, goodbye
// and abort notices). Addresses are exchanged through the rendezvous store.
#pragma once

#include <string>
#include <vector>

#include "distopt/abi.h"
#include "socket.hpp"

namespace distopt::plugins::tcp {

struct MeshArgs {
  int rank = 0;
  int world_size = 1;
  dopt_store* store = nullptr;
  std::string prefix;        ///< store key prefix, identical on every rank
  std::string token;         ///< job secret every connecting peer must present
  std::string bind_address;  ///< interface to listen on
  SocketOptions sockets;
  Clock::time_point deadline;
};

struct Mesh {
  /// Data connections are one-way: out[p] carries this rank's bytes to rank p,
  /// in[p] rank p's bytes to this rank. A TCP connection busy in both
  /// directions at once is markedly slower on loopback than two one-way ones.
  std::vector<int> out, in;
  std::vector<int> ctrl;  ///< ctrl[p]: framed control connection to rank p (-1 for self)
  void close_all();
};

/// Collective. Rank r listens on bind_address:0 and publishes host:port under
/// "<prefix>/tcp/addr/<r>"; it connects to every lower rank and accepts from
/// every higher rank. Each connection starts with a hello (magic, token,
/// prefix, rank, channel); a hello with a wrong token or prefix is refused and
/// logged, and does not count. Throws std::runtime_error on failure/timeout.
Mesh build_mesh(const MeshArgs& a);

}  // namespace distopt::plugins::tcp
