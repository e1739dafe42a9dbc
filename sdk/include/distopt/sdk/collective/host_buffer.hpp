// A DLTensor argument of a host-memory communicator, checked once: dense
// (compact row-major), in host memory, a whole number of bytes per element.
// Shared by `tcp`, `ucx` and out-of-tree communicators that move host memory
// so that every one refuses the same tensors with the same words.
// Header-only, torch-free. Thread safety: pure functions.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/collective/reduce_kernels.hpp"

namespace distopt::sdk {

/// A checked view of a DLTensor's elements (no ownership).
struct HostBuffer {
  char* data = nullptr;  ///< first element (data + byte_offset)
  size_t count = 0;      ///< elements
  size_t elem_size = 0;  ///< bytes per element (bits x lanes / 8)
  DLDataType dtype{};
  size_t bytes() const { return count * elem_size; }
};

/// Checks `t` as the `which` argument ("send", "recv", "buf") of operation
/// `op` of communicator `comm` ("tcp", "ucx"). With `reduce_dtype`, the dtype
/// must also be one the reductions support, stored in *dt when dt is set.
/// Throws sdk::Error "<op>: <which> <why>": UNSUPPORTED for memory other than
/// kDLCPU / kDLCUDAHost or an unsupported dtype, INVALID_ARGUMENT for a bad
/// shape, negative dimension, non-contiguous strides or a NULL data pointer
/// with elements.
inline HostBuffer host_buffer(const DLTensor& t, const char* comm, const char* op,
                              const char* which, bool reduce_dtype = false, DType* dt = nullptr) {
  auto bad = [&](dopt_status s, const std::string& why) {
    return Error(s, std::string(op) + ": " + which + " " + why);
  };
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    throw bad(DOPT_ERR_UNSUPPORTED,
              std::string("is not in host memory (") + comm + " moves host memory only)");
  if (t.ndim < 0 || (t.ndim > 0 && !t.shape))
    throw bad(DOPT_ERR_INVALID_ARGUMENT, "has an invalid shape");
  HostBuffer b;
  b.dtype = t.dtype;
  const size_t bits = static_cast<size_t>(t.dtype.bits) * t.dtype.lanes;
  if (bits == 0 || bits % 8)
    throw bad(DOPT_ERR_UNSUPPORTED, "has a dtype that is not a whole number of bytes");
  b.elem_size = bits / 8;
  if (reduce_dtype) {
    DType d;
    if (!dtype_from_dl(t.dtype, &d))
      throw bad(DOPT_ERR_UNSUPPORTED,
                "dtype is not one of float32, float64, bfloat16, float16, int32, int64");
    if (dt) *dt = d;
  }
  size_t count = 1;
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] < 0) throw bad(DOPT_ERR_INVALID_ARGUMENT, "has a negative dimension");
    if (t.strides && t.shape[i] > 1 && t.strides[i] != expect)
      throw bad(DOPT_ERR_INVALID_ARGUMENT, "is not contiguous");
    expect *= t.shape[i];
    count *= static_cast<size_t>(t.shape[i]);
  }
  b.count = count;
  if (count > 0 && !t.data) throw bad(DOPT_ERR_INVALID_ARGUMENT, "has a NULL data pointer");
  b.data = static_cast<char*>(t.data) + t.byte_offset;
  return b;
}

/// The reduce ops host-memory reductions implement (sum, avg, min, max);
/// throws sdk::Error(INVALID_ARGUMENT) "<op>: unknown reduce op N" otherwise.
inline void require_reduce_op(dopt_reduce_op r, const char* op) {
  if (r != DOPT_REDUCE_SUM && r != DOPT_REDUCE_AVG && r != DOPT_REDUCE_MIN && r != DOPT_REDUCE_MAX)
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                std::string(op) + ": unknown reduce op " + std::to_string(r));
}

/// Throws sdk::Error(INVALID_ARGUMENT) "<op>: send and recv have different
/// dtypes" unless a and b have the same dtype.
inline void require_same_dtype(const HostBuffer& a, const HostBuffer& b, const char* op) {
  if (a.dtype.code != b.dtype.code || a.dtype.bits != b.dtype.bits ||
      a.dtype.lanes != b.dtype.lanes)
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                std::string(op) + ": send and recv have different dtypes");
}

}  // namespace distopt::sdk
