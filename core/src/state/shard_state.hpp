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
  /// Put through put_replicated (ABI 1.6) into a ShardState that keeps
  /// replicas (an elastic commit): every rank holds this value whole.
  bool replicated = false;
  int64_t logical_numel() const;
};

/// The entries of one rank. Keys are unique.
class ShardState {
 public:
  /// Add an entry; throws CheckpointError for a duplicate key or a piece
  /// outside its logical tensor.
  void add(StateEntry e);
  const std::vector<StateEntry>& entries() const { return entries_; }

  /// What put_replicated does on this rank (`rank` of the job): a
  /// checkpoint (keep_replicas false, the default) keeps rank 0's copy as
  /// an ordinary entry and copies nothing on the other ranks; an elastic
  /// commit (true) keeps every rank's copy, marked `replicated`. Set before
  /// the writers are used.
  void keep_replicas(bool keep, int rank) {
    keep_replicas_ = keep;
    rank_ = rank;
  }
  bool replicas_rule_set() const { return rank_ >= 0; }
  /// A whole value every rank holds (put_replicated's rule above).
  void add_replicated(StateEntry e);
  /// Add `other`'s replicated entries as ordinary ones (sharing their data).
  void add_replicas_of(const ShardState& other);
  /// Bytes of entry data (replicated ones included when `replicas`).
  uint64_t data_bytes(bool replicas) const;

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

  /// Which entries pack() takes.
  enum class Part { all, own, replicas };
  /// A flat encoding for bytes that stay in this job's memory (elastic
  /// commits and switches between ranks): a header per entry and its raw
  /// data, about a memcpy's cost where pickling costs ten times more.
  /// `part`: every entry, those not marked replicated, or only those. Not a
  /// file format (no version kept).
  std::vector<char> pack(int rank, int world_size, Part part = Part::all) const;
  /// Parse pack()'s bytes; `where` is named in errors. Throws CheckpointError
  /// for truncated bytes or another rank / world size.
  static ShardState unpack(const std::vector<char>& bytes, const std::string& where, int rank,
                           int world_size);

 private:
  std::vector<StateEntry> entries_;
  std::map<std::string, size_t> index_;
  std::deque<WriterCtx> writers_;  // stable addresses for the C writers' ctx
  bool keep_replicas_ = false;
  int rank_ = -1;  // keep_replicas() not called: add_replicated throws
};

}  // namespace distopt::state
