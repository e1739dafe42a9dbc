// The 8-bit min-max codec of low-precision decentralized SGD
// (plugins/decentralized/minmax_uint8.hpp): round-trip error within half a
// level of each chunk, constant chunks exact, empty input, lengths that do
// not divide into chunks, non-finite chunks, and decoding that does not
// depend on where the bytes lie in memory. Torch-free.
#include "minmax_uint8.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

using namespace distopt::plugins::decentralized;

namespace {

std::vector<float> random_floats(size_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}

std::vector<float> round_trip(const std::vector<float>& x, size_t chunk) {
  std::vector<uint8_t> bytes(minmax_uint8_bytes(x.size(), chunk));
  minmax_uint8_encode(x.data(), x.size(), chunk, bytes.data());
  std::vector<float> y(x.size(), -1.0f);
  minmax_uint8_decode(bytes.data(), x.size(), chunk, y.data());
  return y;
}

// Every element within (max - min) / 510 of its chunk (plus half an ulp of
// the decoded float); returns the largest error relative to that bound.
double check_bound(const std::vector<float>& x, const std::vector<float>& y, size_t chunk) {
  double worst = 0;
  for (size_t first = 0; first < x.size(); first += chunk) {
    const size_t last = std::min(x.size(), first + chunk);
    const auto [lo, hi] = std::minmax_element(x.begin() + first, x.begin() + last);
    const double bound = (static_cast<double>(*hi) - *lo) / 510.0;
    for (size_t i = first; i < last; ++i) {
      const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
      const double ulp = std::nextafter(std::fabs(y[i]), INFINITY) - std::fabs(y[i]);
      CHECK(err <= bound + ulp / 2);
      if (bound > 0) worst = std::max(worst, err / bound);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("bytes: 8 header bytes per chunk plus one per element") {
  CHECK(minmax_uint8_bytes(0, 1024) == 0);
  CHECK(minmax_uint8_bytes(1, 1024) == 9);
  CHECK(minmax_uint8_bytes(1024, 1024) == 1032);
  CHECK(minmax_uint8_bytes(1025, 1024) == 1041);
  CHECK(minmax_uint8_bytes(1370, kMinMaxChunk) == 1386);
  // About a quarter of float32's on large buckets.
  const double ratio = static_cast<double>(minmax_uint8_bytes(1 << 20, kMinMaxChunk)) / (4 << 20);
  CHECK(ratio == doctest::Approx(1032.0 / 4096));
  CHECK_THROWS_AS(minmax_uint8_bytes(10, 0), std::invalid_argument);
}

TEST_CASE("round trip within half a level per chunk, for divisible and partial chunks") {
  for (size_t n : {1u, 7u, 1024u, 1000u, 3000u, 4097u}) {
    for (size_t chunk : {1u, 64u, 1024u, 5000u}) {
      CAPTURE(n);
      CAPTURE(chunk);
      auto x = random_floats(n, static_cast<unsigned>(n * 31 + chunk), 3.0f);
      if (n > 100) x[n / 2] = 1000.0f;  // an outlier coarsens only its own chunk
      const auto y = round_trip(x, chunk);
      const double worst = check_bound(x, y, chunk);
      // Rounding to the nearest level uses the whole half-level budget on
      // random data (Bagua's truncation would need a whole level).
      if (n >= 1000 && chunk >= 64) CHECK(worst > 0.9);
      if (n > 100 && chunk < n) {
        // Chunks away from the outlier keep their own fine levels.
        const size_t far = (n / 2 >= chunk) ? 0 : n - 1;
        CHECK(std::fabs(y[far] - x[far]) < 0.1);
      }
    }
  }
}

TEST_CASE("a constant chunk decodes exactly; zero length is a no-op") {
  std::vector<float> x(300, 0.1f);
  std::fill(x.begin() + 100, x.begin() + 200, -7.25e-3f);
  x[250] = 2.0f;  // the third chunk varies
  const auto y = round_trip(x, 100);
  for (size_t i = 0; i < 200; ++i) CHECK(y[i] == x[i]);
  check_bound(x, y, 100);
  std::vector<float> zero(64, 0.0f);
  CHECK(round_trip(zero, 16) == zero);

  uint8_t sentinel = 0xAB;
  minmax_uint8_encode(nullptr, 0, 1024, &sentinel);
  minmax_uint8_decode(&sentinel, 0, 1024, nullptr);
  CHECK(sentinel == 0xAB);
}

TEST_CASE("a non-finite value makes its chunk NaN, not its neighbours") {
  auto x = random_floats(30, 5, 1.0f);
  x[12] = std::numeric_limits<float>::infinity();
  const auto y = round_trip(x, 10);
  for (size_t i = 0; i < 30; ++i) {
    CAPTURE(i);
    if (i >= 10 && i < 20)
      CHECK(std::isnan(y[i]));
    else
      CHECK(std::fabs(y[i] - x[i]) < 0.05);
  }
}

TEST_CASE("decoding the same bytes anywhere in memory gives the same floats bitwise") {
  const size_t n = 2500, chunk = 256;
  const auto x = random_floats(n, 11, 0.01f);
  std::vector<uint8_t> bytes(minmax_uint8_bytes(n, chunk));
  minmax_uint8_encode(x.data(), n, chunk, bytes.data());
  std::vector<float> a(n);
  minmax_uint8_decode(bytes.data(), n, chunk, a.data());
  // Misaligned input and output: vectorised and scalar code paths meet
  // other elements.
  for (size_t shift : {1u, 2u, 3u}) {
    std::vector<uint8_t> moved(bytes.size() + shift);
    std::memcpy(moved.data() + shift, bytes.data(), bytes.size());
    std::vector<float> b(n + shift);
    minmax_uint8_decode(moved.data() + shift, n, chunk, b.data() + shift);
    CHECK(std::memcmp(a.data(), b.data() + shift, n * sizeof(float)) == 0);
  }
  // Encoding is deterministic too.
  std::vector<uint8_t> again(bytes.size());
  minmax_uint8_encode(x.data(), n, chunk, again.data());
  CHECK(again == bytes);
}

TEST_CASE("decode_add is decoding into a buffer and adding it, bitwise") {
  for (size_t chunk : {7u, 256u, 1000u}) {  // below 256 no level table; 1000: a lane tail
    for (size_t n : {1u, 999u, 3001u}) {
      CAPTURE(chunk);
      CAPTURE(n);
      auto x = random_floats(n, 21, 0.02f);
      if (n > 2 * chunk) x[chunk + 3] = std::numeric_limits<float>::quiet_NaN();  // a NaN chunk
      std::vector<uint8_t> bytes(minmax_uint8_bytes(n, chunk));
      minmax_uint8_encode(x.data(), n, chunk, bytes.data());
      const auto base = random_floats(n, 22, 1.0f);
      std::vector<float> decoded(n), want(n), got = base;
      minmax_uint8_decode(bytes.data(), n, chunk, decoded.data());
      for (size_t i = 0; i < n; ++i) want[i] = base[i] + decoded[i];
      minmax_uint8_decode_add(bytes.data(), n, chunk, got.data());
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("min, max and non-finite values are found anywhere in a long chunk") {
  // chunk 1000 = 62 vector steps of 16 lanes and a tail of 8: the extremes
  // and the non-finite values sit in the lanes and in the tail.
  const size_t chunk = 1000, n = 4000;
  auto x = random_floats(n, 31, 0.01f);
  x[5] = std::numeric_limits<float>::quiet_NaN();           // chunk 0, a lane
  x[1000 + 995] = -std::numeric_limits<float>::infinity();  // chunk 1, the tail
  x[2000 + 17] = -3.0f;                                     // chunk 2's min in a lane
  x[2000 + 998] = 2.0f;                                     // and its max in the tail
  x[3000 + 999] = -1.0f;                                    // chunk 3's min, the last element
  x[3000 + 0] = 1.5f;                                       // and its max, the first
  std::vector<uint8_t> bytes(minmax_uint8_bytes(n, chunk));
  minmax_uint8_encode(x.data(), n, chunk, bytes.data());
  float header[4][2];
  std::memcpy(header, bytes.data(), sizeof(header));
  CHECK(std::isnan(header[0][0]));
  CHECK(std::isnan(header[1][1]));
  CHECK(header[2][0] == -3.0f);
  CHECK(header[2][1] == 2.0f);
  CHECK(header[3][0] == -1.0f);
  CHECK(header[3][1] == 1.5f);
  std::vector<float> y(n);
  minmax_uint8_decode(bytes.data(), n, chunk, y.data());
  CHECK(y[2000 + 17] == -3.0f);  // the ends decode exactly
  CHECK(y[2000 + 998] == 2.0f);
  CHECK(y[3000 + 999] == -1.0f);
}
