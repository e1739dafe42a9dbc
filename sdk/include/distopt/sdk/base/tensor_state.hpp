// at::Tensor overloads of the state writer / reader (distopt/sdk/base/state_io.hpp).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "distopt/sdk/base/state_io.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::sdk {

/// Put `piece` (any layout; made contiguous on the CPU first) as elements
/// [offset, offset + piece.numel()) of logical tensor `key` of shape `shape`.
inline void put_sharded(StateWriter& w, const std::string& key, const at::Tensor& piece,
                        int64_t offset, at::IntArrayRef shape) {
  at::Tensor c = piece.detach().to(at::kCPU).contiguous();
  DLView v(c);
  w.put_sharded(key, *v.get(), offset, std::vector<int64_t>(shape.begin(), shape.end()));
}

/// Put a whole tensor (offset 0, its own shape).
inline void put_whole(StateWriter& w, const std::string& key, const at::Tensor& t) {
  put_sharded(w, key, t.reshape({-1}), 0, t.sizes());
}

/// Put this rank's own value of `key` (error-feedback residuals, RNG state).
inline void put_local(StateWriter& w, const std::string& key, const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  DLView v(c);
  w.put_local(key, *v.get());
}

/// Elements [offset, offset + numel) of `key` as a new 1-D CPU tensor of `dtype`.
inline at::Tensor read_range(const StateReader& r, const std::string& key, int64_t offset,
                             int64_t numel, at::ScalarType dtype) {
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(dtype));
  DLView v(out);
  r.read(key, offset, *v.get());
  return out;
}

/// Read elements [offset, offset + dst.numel()) of `key` into `dst` in place
/// (any device, dtype converted). dst must be contiguous.
inline void read_into(const StateReader& r, const std::string& key, int64_t offset,
                      at::Tensor dst) {
  at::Tensor tmp = read_range(r, key, offset, dst.numel(), dst.scalar_type());
  dst.view({-1}).copy_(tmp);
}

/// The whole of `key` with its saved shape and dtype.
inline at::Tensor read_whole(const StateReader& r, const std::string& key) {
  StateInfo info;
  if (!r.find(key, &info))
    throw Error(DOPT_ERR_INVALID_ARGUMENT, "checkpoint has no state '" + key + "'");
  return read_range(r, key, 0, info.numel(), to_scalar_type(info.dtype)).view(info.shape);
}

/// A step counter as this rank's own int64 scalar (0-d, RANK_LOCAL) under
/// `key`. Throws what the writer throws (sdk::Error).
inline void put_counter(StateWriter& w, const std::string& key, int64_t value) {
  put_local(w, key, at::full({}, value, at::kLong));
}

/// The counter put by put_counter, or `fallback` when the checkpoint has
/// none (on another world size: saved rank (r mod saved world size)'s,
/// state.h). Throws what the reader throws.
inline int64_t read_counter(const StateReader& r, const std::string& key, int64_t fallback) {
  if (!r.find(key)) return fallback;
  return read_whole(r, key).item<int64_t>();
}

}  // namespace distopt::sdk
