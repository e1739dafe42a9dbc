// Who a rank averages its parameters with, and with which weights: the
// mixing matrix W of decentralized SGD (D-PSGD, Lian et al., NeurIPS 2017).
// Every topology here gives a symmetric, doubly stochastic W (rows and
// columns sum to 1), so a gossip round keeps the mean of the replicas and
// repeated rounds drive them to it. Torch-free, no communication.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distopt::plugins::decentralized {

/// One neighbour of a rank in a gossip round and its weight W[rank][peer].
struct Link {
  int32_t peer;
  double weight;
};

/// Row `rank` of W for one round: x_rank <- self_weight * x_rank +
/// sum(link.weight * x_link.peer). average_all: W = (1/n) 11^T, done as an
/// allreduce instead of n - 1 exchanges.
struct MixingRow {
  double self_weight = 1.0;
  std::vector<Link> links;
  bool average_all = false;
};

/// Topologies (the `topology` option):
///   ring         left and right neighbours, weights 1/3 (1/2 for 2 ranks)
///   shift_one    Bagua's: one peer per round, a matching between the lower
///                and upper half of the ranks that rotates every round, so
///                every lower/upper pair meets once per n/2 rounds; weights
///                1/2; needs an even number of ranks
///   complete     the mean over all ranks (an allreduce)
///   exponential  peers at distance 2^k both ways (the undirected variant of
///                SGP's graph, Assran et al., ICML 2019), Metropolis-Hastings
///                weights
///   neighbors    explicit, symmetric adjacency lists ("0:1,3; 1:0,2; ..."),
///                Metropolis-Hastings weights 1/(1 + max(deg_i, deg_j)) so W
///                is doubly stochastic on irregular graphs
class Topology {
 public:
  /// Throws std::invalid_argument with a message for an unknown kind, an odd
  /// world size with shift_one, or (neighbors) a malformed list, a rank out
  /// of range, a self loop, an asymmetric or disconnected graph.
  Topology(const std::string& kind, const std::string& neighbors, int32_t world_size);

  /// Row `rank` of W in communication round `round` (0, 1, ...).
  MixingRow row(int32_t rank, int64_t round) const;
  /// shift_one's partner of `rank` in round `round`.
  static int32_t shift_one_peer(int32_t rank, int64_t round, int32_t world_size);
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  int32_t world_;
  std::vector<std::vector<int32_t>> adjacency_;  // static graphs (ring, exponential, neighbors)
};

/// Parse "0:1,3; 1:0,2" into adjacency lists of `world_size` ranks (ranks
/// not named have none). Throws std::invalid_argument naming the bad part.
std::vector<std::vector<int32_t>> parse_neighbors(const std::string& text, int32_t world_size);

}  // namespace distopt::plugins::decentralized
