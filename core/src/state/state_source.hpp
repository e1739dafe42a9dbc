// The saved state of every rank (a checkpoint's shards, or the bytes of an
// in-memory exchange), indexed by logical tensor: answers "elements [a, b)
// of key K" for any range, which is what resharding needs (state.h
// describes the rules for SHARDED and RANK_LOCAL entries).
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "distopt/state.h"
#include "state/shard_state.hpp"

namespace distopt::state {

class StateSource {
 public:
  /// shards[r] is what saved rank r wrote; `rank` / `world_size` are the
  /// loading rank's. Throws CheckpointError when pieces of one key disagree
  /// on kind or shape.
  StateSource(std::vector<ShardState> shards, int rank, int world_size);
  StateSource(const StateSource&) = delete;  // the index points into shards_
  StateSource& operator=(const StateSource&) = delete;

  int saved_world_size() const { return static_cast<int>(shards_.size()); }
  bool has(const std::string& key) const { return index_.count(key) != 0; }
  /// Keys with this prefix, sorted.
  std::vector<std::string> keys(const std::string& prefix = "") const;
  const StateEntry& first(const std::string& key) const;  ///< kind, shape, dtype
  /// Elements [offset, offset + out.numel()) of `key` into `out` (1-D view
  /// of a contiguous CPU tensor; dtype converted). Throws CheckpointError.
  void read(const std::string& key, int64_t offset, at::Tensor out) const;
  /// The whole logical tensor (saved dtype and shape).
  at::Tensor whole(const std::string& key) const;
  /// A RANK_LOCAL entry as saved rank `saved_rank` holds it (undefined if absent).
  at::Tensor local(const std::string& key, int saved_rank) const;

  /// A reader for a component: keys get `prefix`. Refers to this object.
  dopt_state_reader reader(const std::string* prefix) const;
  struct ReaderCtx {
    const StateSource* source;
    const std::string* prefix;
  };

 private:
  struct Piece {
    int rank;
    const StateEntry* entry;
  };
  std::vector<ShardState> shards_;
  std::map<std::string, std::vector<Piece>> index_;  // pieces in increasing rank
  int rank_, world_size_;
  mutable std::deque<ReaderCtx> readers_;
};

}  // namespace distopt::state
