// Sizes every component needs when it counts what it sends (bytes_sent) or
// checks the tensors it is handed. Torch-free, header-only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "distopt/abi.h"

namespace distopt::sdk {

/// Elements of a DLTensor: the product of its shape (1 for ndim 0).
/// Strides are not consulted.
inline size_t dl_numel(const DLTensor& t) {
  size_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[i]);
  return n;
}

/// Bytes of a dense DLTensor's elements: dl_numel x ceil(bits x lanes / 8).
inline uint64_t dl_nbytes(const DLTensor& t) {
  return static_cast<uint64_t>(dl_numel(t)) * ((t.dtype.bits * t.dtype.lanes + 7u) / 8u);
}

/// Bytes one rank sends in a ring (or any bandwidth-optimal) allreduce of
/// `bytes` over `world` ranks: 2 (W-1)/W x bytes, 0 on one rank. This is the
/// factor nccl-tests divide by to turn algorithm into bus bandwidth.
inline uint64_t ring_allreduce_bytes(uint64_t bytes, int32_t world) {
  if (world <= 1) return 0;
  return 2 * bytes * static_cast<uint64_t>(world - 1) / static_cast<uint64_t>(world);
}

/// Bytes one rank sends in an allgather of its own `bytes` (ring or direct:
/// each of the other W-1 ranks needs them once), 0 on one rank.
inline uint64_t allgather_bytes(uint64_t bytes, int32_t world) {
  return world <= 1 ? 0 : bytes * static_cast<uint64_t>(world - 1);
}

}  // namespace distopt::sdk
