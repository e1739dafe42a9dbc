// Which node every rank is on, and how the `ring` variant cuts a bucket
// into pieces that cross nodes. Torch-free, pure (no communication).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace distopt::plugins::hierarchical {

/// This rank's node name. DISTOPT_NODE_ID (its value passed as `env`, NULL
/// when unset) overrides the host name: either one name for this rank, or a
/// comma-separated list with one name per rank, entry `rank` being this
/// rank's (one setting for a whole `distopt train` on one host, e.g.
/// "a,a,b,b" for 2 nodes x 2 ranks). Without it, the host name
/// (gethostname). Throws std::invalid_argument naming DISTOPT_NODE_ID for an
/// empty name, or a list whose length is not `world_size`.
std::string node_name(int32_t rank, int32_t world_size, const char* env);

/// 64-bit FNV-1a hash of a node name: what ranks exchange (an allgather of
/// one int64 each). Two names colliding would merge two nodes, which costs
/// bandwidth, never correctness.
int64_t node_key(const std::string& name);

/// The nodes of a job. Nodes are numbered by their lowest rank (the node of
/// rank 0 is node 0); within a node, ranks are numbered by rank.
struct NodeLayout {
  int32_t rank = 0;
  std::vector<int32_t> node_of;               ///< node index of every rank
  std::vector<int32_t> local_of;              ///< every rank's index within its node
  std::vector<int32_t> node_size;             ///< ranks per node
  std::vector<std::vector<int32_t>> members;  ///< every node's ranks, ascending

  int32_t world_size() const { return static_cast<int32_t>(node_of.size()); }
  int32_t num_nodes() const { return static_cast<int32_t>(node_size.size()); }
  int32_t node() const { return node_of[rank]; }
  int32_t local() const { return local_of[rank]; }
  int32_t local_size() const { return node_size[node()]; }
  /// The largest node's size (S, the number of ring pieces).
  int32_t max_local_size() const;
  /// "2 nodes of 2+1 ranks".
  std::string describe() const;
};

/// The layout from every rank's node key (index = rank), seen from `rank`.
/// Throws std::invalid_argument when `rank` is not in [0, keys.size()).
NodeLayout make_layout(const std::vector<int64_t>& keys, int32_t rank);

/// The `ring` variant's cut of a bucket of `numel` elements: S pieces of
/// `piece` = ceil(numel / S) elements each (the last ones padded with
/// zeros, or empty), S = the largest node's size. On a node of L ranks,
/// local rank j holds pieces j, j + L, j + 2L, ... in its `slots` =
/// ceil(S / L) slots; a piece is reduced across nodes by its holders, one
/// per node. With equal node sizes S = L, one slot each: the classic
/// reduce-scatter / allreduce / allgather of Horovod and Bagua.
struct PiecePlan {
  size_t numel = 0;        ///< the bucket's elements
  size_t pieces = 0;       ///< S
  size_t piece = 0;        ///< elements per piece, padding included
  size_t slots = 0;        ///< pieces per local rank (some may be none)
  int32_t local_size = 1;  ///< L, this node's ranks

  PiecePlan(size_t numel, int32_t max_local_size, int32_t local_size);
  /// The piece in slot `slot` of local rank `j`, or -1 when that slot is empty.
  int64_t piece_at(int32_t j, size_t slot) const;
  /// The local rank on a node of `l` ranks that holds piece k.
  static int32_t holder(size_t k, int32_t l) { return static_cast<int32_t>(k % l); }
  /// Elements [first(k), last(k)) of the bucket are piece k's (last may equal first).
  size_t first(size_t k) const;
  size_t last(size_t k) const;
  /// Elements each local rank gets from the reduce-scatter (slots x piece).
  size_t block() const { return slots * piece; }
  /// Whether the bucket itself is the reduce-scatter's input and the
  /// allgather's output: one slot per rank and no padding.
  bool in_place() const { return slots == 1 && numel == pieces * piece; }
};

}  // namespace distopt::plugins::hierarchical
