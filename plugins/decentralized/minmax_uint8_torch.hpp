// The 8-bit min-max codec of minmax_uint8.hpp on libtorch ops, for buffers on
// any device (CUDA included): low-precision gossip encodes and decodes its
// device buffers with it, with no host round trip. Same wire layout (C pairs
// of float32 (min, max), then n uint8 codes), and the same bytes:
//   encode: per chunk amin / amax, a non-finite chunk as NaN, NaN with codes
//           0; code = min(int(double(x - min) * (255 / (max - min)) + 0.5),
//           255) in float64, the host encoder's arithmetic (equal bytes
//           where the compiler does not contract that expression into an
//           FMA; x86-64 without -mfma does not);
//   decode: per chunk a table of the 256 levels float(double(min) +
//           double(code) * (double(max) - double(min)) / 255), as the host
//           decoder, then a lookup: bitwise the host decoder's floats (each
//           op is one IEEE-rounded float64 op, the division a true one).
// Costs: encode float64 work and temporaries of 8 bytes per element; decode
// C x 256 float64 values and an int32 index per element.
// Ops are enqueued on the current stream; nothing synchronizes with the
// host. Thread safety: distinct tensors per call.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace distopt::plugins::decentralized {

/// Encode x (1-D contiguous float32, n elements) into out (1-D contiguous
/// uint8 of minmax_uint8_bytes(n, chunk) bytes, x's device). Throws
/// std::invalid_argument for chunk <= 0 or mismatched sizes, dtypes or
/// devices.
void minmax_uint8_encode_torch(const at::Tensor& x, int64_t chunk, const at::Tensor& out);

/// Decode `in` (what either encoder wrote for x.numel() elements and this
/// chunk; uint8, x's device) into x (1-D contiguous float32). Throws
/// std::invalid_argument as the encoder does.
void minmax_uint8_decode_torch(const at::Tensor& in, int64_t chunk, const at::Tensor& x);

}  // namespace distopt::plugins::decentralized
