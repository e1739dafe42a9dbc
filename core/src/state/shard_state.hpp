// One rank's state: the entries its components put through the ABI 1.1
// writer (distopt/state.h), and its encoding (a checkpoint shard file, or
// the bytes add_param_group / switch_to exchange between ranks).
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "distopt/state.h"

namespace distopt::state {

/// One piece of a logical tensor, as saved.
struct StateEntry {
  std::string key;  ///< full key ("algorithm/optimizer/fc1.weight/exp_avg")
  int32_t kind = DOPT_STATE_SHARDED;
  int64_t offset = 0;          ///< first element within the logical tensor
  std::vector<int64_t> shape;  ///< the logical tensor's shape
  at::Tensor data;             ///< 1-D, CPU, owned copy
  int64_t logical_numel() const;
};

/// The entries of one rank. Keys are unique.
class ShardState {
 public:
  /// Add an entry; throws CheckpointError for a duplicate key or a piece
  /// outside its logical tensor.
  void add(StateEntry e);
  const std::vector<StateEntry>& entries() const { return entries_; }

  /// A writer for a component: keys get `prefix` ("algorithm/"). The writer
  /// refers to this object and `prefix` (both must outlive it; do not move
  /// this object while a writer is in use).
  dopt_state_writer writer(const std::string* prefix);
  struct WriterCtx {
    ShardState* shard;
    const std::string* prefix;
  };

  /// torch::pickle_save encoding: {"format": "distopt-shard-1", "rank", "world_size",
  /// "entries": [{"key", "kind", "offset", "shape", "data"}]}.
  std::vector<char> encode(int rank, int world_size) const;
  /// Parse bytes from `file` (named in errors); checks the format, rank and
  /// world size. Throws CheckpointError.
  static ShardState decode(const std::vector<char>& bytes, const std::string& file, int rank,
                           int world_size);

 private:
  std::vector<StateEntry> entries_;
  std::map<std::string, size_t> index_;
  std::deque<WriterCtx> writers_;  // stable addresses for the C writers' ctx
};

}  // namespace distopt::state
