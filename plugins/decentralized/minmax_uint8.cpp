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

// Whether every value is finite: no exponent of all ones (inf, NaN); an OR
// over the bits, which vectorises where std::isfinite does not.
bool all_finite(const float* x, size_t n) {
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}

void encode_chunk(const float* x, size_t n, float* header, uint8_t* codes) {
  if (!all_finite(x, n)) {
    header[0] = header[1] = std::numeric_limits<float>::quiet_NaN();
    std::memset(codes, 0, n);
    return;
  }
  float lo = x[0], hi = x[0];
  for (size_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  header[0] = lo;
  header[1] = hi;
  const double span = static_cast<double>(hi) - static_cast<double>(lo);
  if (span == 0.0) {
    std::memset(codes, 0, n);
    return;
  }
  // x >= lo, so pos >= 0 and truncating pos + 0.5 rounds to the nearest
  // level; only the sender encodes, so this need not match anyone bitwise.
  const double scale = kLevels / span;
  for (size_t i = 0; i < n; ++i) {
    const double pos = (static_cast<double>(x[i]) - lo) * scale + 0.5;
    codes[i] = static_cast<uint8_t>(std::min(static_cast<int32_t>(pos), 255));
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
  const size_t c = chunks(n, chunk);
  const uint8_t* codes = in + 2 * sizeof(float) * c;
  for (size_t k = 0; k < c; ++k) {
    const size_t first = k * chunk, len = std::min(chunk, n - first);
    float header[2];
    std::memcpy(header, in + 2 * sizeof(float) * k, sizeof(header));
    if (len < 256) {
      for (size_t i = first; i < first + len; ++i) x[i] = level(header[0], header[1], codes[i]);
      continue;
    }
    float table[256];  // the same values as level(): one division per level, not per element
    for (int c = 0; c < 256; ++c) table[c] = level(header[0], header[1], static_cast<uint8_t>(c));
    for (size_t i = first; i < first + len; ++i) x[i] = table[codes[i]];
  }
}

}  // namespace distopt::plugins::decentralized
