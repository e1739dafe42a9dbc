// C++ views of the ABI 1.1 state writer / reader (distopt/state.h) that
// throw sdk::Error instead of returning a status. Torch-free; torch users
// add distopt/sdk/base/tensor_state.hpp. Not thread-safe (the host calls
// save_state / load_state from the training thread).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "distopt/sdk/base/host.hpp"
#include "distopt/state.h"

namespace distopt::sdk {

namespace detail {
/// Throw the status a host callback returned (its message is already in the
/// error sink: keep it).
inline void check_host(dopt_status st, const std::string& what) {
  if (st != DOPT_OK) throw Error::reported(st, what);
}
}  // namespace detail

/// Where save_state puts entries (borrowed for the call).
class StateWriter {
 public:
  explicit StateWriter(const dopt_state_writer& w) : w_(w) {}

  /// Put elements [offset, offset + numel(piece)) of the logical tensor `key`
  /// of shape `shape` (DOPT_STATE_SHARDED). The host copies the data.
  void put_sharded(const std::string& key, const DLTensor& piece, int64_t offset,
                   const std::vector<int64_t>& shape) {
    put(key, piece, DOPT_STATE_SHARDED, offset, shape);
  }
  /// Put this rank's own value of `key` (DOPT_STATE_RANK_LOCAL).
  void put_local(const std::string& key, const DLTensor& value) {
    std::vector<int64_t> shape(value.shape, value.shape + value.ndim);
    put(key, value, DOPT_STATE_RANK_LOCAL, 0, shape);
  }
  /// The C writer this wraps (to hand it on, e.g. to an inner reducer).
  const dopt_state_writer& c() const { return w_; }

  /// A view for state that every rank holds whole and equal (plain
  /// allreduce's optimizer state): call it on every rank and put whole
  /// tensors (offset 0) with put_sharded. The host keeps rank 0's copy in a
  /// checkpoint and each rank's own in an elastic commit (put_replicated,
  /// ABI 1.6); with an older host only rank `rank`== 0 puts. put_local is
  /// unchanged. Refers to the same C writer (borrowed like this one).
  StateWriter replicated(int rank) const {
    StateWriter r(w_);
    r.replicated_ = true;
    r.rank_ = rank;
    return r;
  }

 private:
  void put(const std::string& key, const DLTensor& t, int32_t kind, int64_t offset,
           const std::vector<int64_t>& shape) {
    if (replicated_ && kind == DOPT_STATE_SHARDED) {
      if (DOPT_HAS_FIELD(&w_, dopt_state_writer, put_replicated) && w_.put_replicated)
        return put_with(w_.put_replicated, key, t, kind, offset, shape);
      if (rank_ != 0) return;  // an older host: one copy is the whole state
    }
    put_with(w_.put, key, t, kind, offset, shape);
  }
  void put_with(dopt_status (*fn)(void*, const dopt_state_entry*), const std::string& key,
                const DLTensor& t, int32_t kind, int64_t offset,
                const std::vector<int64_t>& shape) {
    dopt_state_entry e{};
    e.struct_size = DOPT_STATE_ENTRY_STRUCT_SIZE;
    e.key = key.c_str();
    e.tensor = &t;
    e.kind = kind;
    e.offset = offset;
    e.ndim = static_cast<int32_t>(shape.size());
    e.shape = shape.empty() ? nullptr : shape.data();
    detail::check_host(fn(w_.ctx, &e), "state put '" + key + "'");
  }
  const dopt_state_writer& w_;
  bool replicated_ = false;
  int rank_ = 0;
};

/// What a saved logical tensor looks like (StateReader::find).
struct StateInfo {
  int32_t kind = DOPT_STATE_SHARDED;
  DLDataType dtype{};
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

/// What load_state reads from (borrowed for the call).
class StateReader {
 public:
  explicit StateReader(const dopt_state_reader& r) : r_(r) {}

  /// World size of the job that saved the checkpoint.
  int32_t saved_world_size() const { return r_.saved_world_size; }
  /// Whether `key` was saved; fills *info when it was and info != nullptr.
  bool find(const std::string& key, StateInfo* info = nullptr) const {
    int32_t found = 0, kind = 0, ndim = 0;
    DLDataType dtype{};
    std::array<int64_t, 8> shape{};
    detail::check_host(r_.find(r_.ctx, key.c_str(), &found, &kind, &dtype, &ndim, shape.data()),
                       "state find '" + key + "'");
    if (found && info) {
      info->kind = kind;
      info->dtype = dtype;
      info->shape.assign(shape.begin(), shape.begin() + ndim);
    }
    return found != 0;
  }
  /// Fill `out` with elements [offset, offset + numel(out)) of `key`
  /// (converted to out's dtype). Throws sdk::Error(INVALID_ARGUMENT) naming
  /// the key when it is missing or the range is not in it.
  void read(const std::string& key, int64_t offset, DLTensor& out) const {
    detail::check_host(r_.read(r_.ctx, key.c_str(), offset, &out), "state read '" + key + "'");
  }
  /// The C reader this wraps (to build adapters such as PreferPrefixReader).
  const dopt_state_reader& c() const { return r_; }

 private:
  const dopt_state_reader& r_;
};

}  // namespace distopt::sdk
