// Sign bits packed 8 per byte, for the `signsgd` reducer (header-only so the
// tests check the exact wire format). Element i of a packed run goes to byte
// i / 8, bit i % 8 (least significant first); 1 means negative (x < 0), so
// +0, -0 and NaN all read as +1. Unused bits of the last byte are 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace distopt::plugins::compress {

/// Bytes that hold n packed signs.
constexpr size_t packed_bytes(size_t n) { return (n + 7) / 8; }

/// Pack the signs of x[0..n) into out[0..packed_bytes(n)) (every byte written).
inline void pack_signs(const float* x, size_t n, uint8_t* out) {
  const size_t full = n / 8;
  for (size_t b = 0; b < full; ++b) {
    const float* p = x + 8 * b;
    uint8_t v = 0;
    for (int j = 0; j < 8; ++j) v |= static_cast<uint8_t>((p[j] < 0.0f) << j);
    out[b] = v;
  }
  if (n % 8) {
    uint8_t v = 0;
    for (size_t j = 0; j < n % 8; ++j) v |= static_cast<uint8_t>((x[8 * full + j] < 0.0f) << j);
    out[full] = v;
  }
}

/// +1 or -1: the sign of element i of a packed run.
inline float unpack_sign(const uint8_t* packed, size_t i) {
  return ((packed[i / 8] >> (i % 8)) & 1u) ? -1.0f : 1.0f;
}

}  // namespace distopt::plugins::compress
