#include "minmax_uint8.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace distopt::plugins::decentralized {
namespace {

constexpr double kLevels = 255.0;

size_t chunks(size_t n, size_t chunk) {
  if (chunk == 0) throw std::invalid_argument("minmax_uint8: chunk size 0");
  return (n + chunk - 1) / chunk;
}

// The value of `code` in a chunk [lo, hi]; the one formula both sides use.
float level(float lo, float hi, uint8_t code) {
  const double span = static_cast<double>(hi) - static_cast<double>(lo);
  return static_cast<float>(static_cast<double>(lo) + static_cast<double>(code) * span / kLevels);
}

// 1 when v is not finite (exponent all ones: inf, NaN); a bit test, which
// vectorises where std::isfinite does not.
inline uint32_t not_finite(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

// The minimum and maximum of x[0..n) (n > 0) and whether every value is
// finite, in one pass. kLanes independent minima and maxima, so that the
// loop vectorises without -ffast-math (a single running minimum is a
// dependency chain); min and max are order-independent for finite values,
// and a chunk with a non-finite one is sent as NaN whatever they are.
constexpr size_t kLanes = 16;
bool range(const float* x, size_t n, float* lo_out, float* hi_out) {
  float lo = x[0], hi = x[0];
  uint32_t bad = 0;
  size_t i = 0;
  if (n >= kLanes) {
    float l[kLanes], h[kLanes];
    uint32_t b[kLanes];
    for (size_t k = 0; k < kLanes; ++k) {
      l[k] = h[k] = x[k];
      b[k] = 0;
    }
    for (; i + kLanes <= n; i += kLanes)
      for (size_t k = 0; k < kLanes; ++k) {
        const float v = x[i + k];
        l[k] = v < l[k] ? v : l[k];
        h[k] = h[k] < v ? v : h[k];
        b[k] |= not_finite(v);
      }
    for (size_t k = 0; k < kLanes; ++k) {
      lo = l[k] < lo ? l[k] : lo;
      hi = hi < h[k] ? h[k] : hi;
      bad |= b[k];
    }
  }
  for (; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = hi < x[i] ? x[i] : hi;
    bad |= not_finite(x[i]);
  }
  *lo_out = lo;
  *hi_out = hi;
  return bad == 0;
}

void encode_chunk(const float* x, size_t n, float* header, uint8_t* codes) {
  if (!range(x, n, &header[0], &header[1])) {
    header[0] = header[1] = std::numeric_limits<float>::quiet_NaN();
    std::memset(codes, 0, n);
    return;
  }
  const double lo = header[0];
  const double span = static_cast<double>(header[1]) - lo;
  if (span == 0.0) {
    std::memset(codes, 0, n);
    return;
  }
  // x >= lo, so pos >= 0 and truncating pos + 0.5 rounds to the nearest
  // level; only the sender encodes, so this need not match anyone bitwise.
  const double scale = kLevels / span;
  for (size_t i = 0; i < n; ++i) {
    const double pos = (static_cast<double>(x[i]) - lo) * scale + 0.5;
    const int32_t p = static_cast<int32_t>(pos);
    codes[i] = static_cast<uint8_t>(p < 255 ? p : 255);
  }
}

// Every level of a chunk: the same values as level(), 256 divisions in one
// vectorised loop rather than one per element.
void levels(float lo, float hi, float* table) {
  const double l = lo, span = static_cast<double>(hi) - static_cast<double>(lo);
  for (int c = 0; c < 256; ++c)
    table[c] = static_cast<float>(l + static_cast<double>(c) * span / kLevels);
}

// x[i] = D(code) (Add false) or x[i] += D(code) (Add true) for one chunk.
template <bool Add>
void decode_chunk(const float header[2], const uint8_t* codes, size_t n, float* x) {
  if (n < 256) {  // fewer elements than levels: no table
    for (size_t i = 0; i < n; ++i) {
      const float v = level(header[0], header[1], codes[i]);
      x[i] = Add ? x[i] + v : v;
    }
    return;
  }
  float table[256];
  levels(header[0], header[1], table);
  for (size_t i = 0; i < n; ++i) x[i] = Add ? x[i] + table[codes[i]] : table[codes[i]];
}

template <bool Add>
void decode(const uint8_t* in, size_t n, size_t chunk, float* x) {
  const size_t c = chunks(n, chunk);
  const uint8_t* codes = in + 2 * sizeof(float) * c;
  for (size_t k = 0; k < c; ++k) {
    const size_t first = k * chunk, len = std::min(chunk, n - first);
    float header[2];
    std::memcpy(header, in + 2 * sizeof(float) * k, sizeof(header));
    decode_chunk<Add>(header, codes + first, len, x + first);
  }
}

}  // namespace

size_t minmax_uint8_bytes(size_t n, size_t chunk) {
  return 2 * sizeof(float) * chunks(n, chunk) + n;
}

void minmax_uint8_encode(const float* x, size_t n, size_t chunk, uint8_t* out) {
  const size_t c = chunks(n, chunk);
  uint8_t* codes = out + 2 * sizeof(float) * c;
  for (size_t k = 0; k < c; ++k) {
    const size_t first = k * chunk, len = std::min(chunk, n - first);
    float header[2];
    encode_chunk(x + first, len, header, codes + first);
    std::memcpy(out + 2 * sizeof(float) * k, header, sizeof(header));
  }
}

void minmax_uint8_decode(const uint8_t* in, size_t n, size_t chunk, float* x) {
  decode<false>(in, n, chunk, x);
}

void minmax_uint8_decode_add(const uint8_t* in, size_t n, size_t chunk, float* x) {
  decode<true>(in, n, chunk, x);
}

}  // namespace distopt::plugins::decentralized
