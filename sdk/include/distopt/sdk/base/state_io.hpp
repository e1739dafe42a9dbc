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

 private:
  void put(const std::string& key, const DLTensor& t, int32_t kind, int64_t offset,
           const std::vector<int64_t>& shape) {
    dopt_state_entry e{};
    e.struct_size = DOPT_STATE_ENTRY_STRUCT_SIZE;
    e.key = key.c_str();
    e.tensor = &t;
    e.kind = kind;
    e.offset = offset;
    e.ndim = static_cast<int32_t>(shape.size());
    e.shape = shape.empty() ? nullptr : shape.data();
    detail::check_host(w_.put(w_.ctx, &e), "state put '" + key + "'");
  }
  const dopt_state_writer& w_;
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
