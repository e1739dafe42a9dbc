// How a rank writes into its shared-memory segment
// (sdk/transport/shm_segment.hpp): stream_copy gives memcpy's bytes at any
// alignment and length, and WriteTuner's choice between plain and streaming
// stores follows the measured rates (fed here, so nothing depends on this
// machine's speed).
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "distopt/sdk/transport/shm_segment.hpp"

using namespace distopt::sdk::shm;

TEST_CASE("stream_copy: memcpy's bytes at every alignment and length, neighbours untouched") {
  std::vector<char> src(70000), dst(70200), want;
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + 7);
  for (size_t soff : {size_t(0), size_t(1), size_t(13), size_t(64)})
    for (size_t doff : {size_t(0), size_t(3), size_t(16), size_t(63), size_t(100)})
      for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(63),
                       size_t(64), size_t(65), size_t(1000), size_t(65536), size_t(69000)}) {
        CAPTURE(soff);
        CAPTURE(doff);
        CAPTURE(n);
        std::fill(dst.begin(), dst.end(), char(0x5a));
        want = dst;
        std::memcpy(want.data() + doff, src.data() + soff, n);
        stream_copy(dst.data() + doff, src.data() + soff, n);
        REQUIRE(dst == want);
      }
}

TEST_CASE("WriteTuner: copies the bytes in every mode and at every size") {
  for (Stores mode : {Stores::automatic, Stores::plain, Stores::streaming}) {
    WriteTuner t(mode);
    std::vector<char> src(300000), dst(300000);
    for (int round = 0; round < 40; ++round) {
      const size_t n = round % 2 ? 1000 : WriteTuner::kMinBytes + 4096 * round;
      for (size_t i = 0; i < n; ++i) src[i] = static_cast<char>(i + round);
      t.copy(dst.data(), src.data(), n);
      REQUIRE(std::memcmp(dst.data(), src.data(), n) == 0);
    }
    CHECK(t.streaming() == (mode == Stores::streaming ||
                            (mode == Stores::automatic &&
                             t.seconds_per_byte(1) < WriteTuner::kMargin * t.seconds_per_byte(0))));
  }
}

#ifdef DOPT_SHM_STREAM_STORES
TEST_CASE("WriteTuner: measures both ways, keeps the clearly faster one, and keeps looking") {
  WriteTuner t;
  // Two plain copies, then two streaming; each way's first is not counted.
  CHECK(t.next_way() == 0);
  t.record(0, 100e-12);  // page faults: ignored
  CHECK(t.next_way() == 0);
  t.record(0, 1e-12);
  CHECK(t.next_way() == 1);
  t.record(1, 100e-12);
  CHECK(t.next_way() == 1);
  t.record(1, 0.9e-12);
  // Streaming 10% faster is not enough: plain stays.
  CHECK_FALSE(t.streaming());
  int other = 0;
  for (unsigned i = 0; i < 4 * WriteTuner::kExplore; ++i) {
    const int w = t.next_way();
    other += w;
    t.record(w, w == 0 ? 1e-12 : 0.9e-12);
  }
  CHECK(other == 4);  // one in kExplore went the other way
  CHECK_FALSE(t.streaming());

  // Plain copies turn 10x slower (a VM's cores moved apart): streaming
  // wins within a few of them, and everything but the probes streams.
  for (int i = 0; i < 3; ++i) t.record(0, 10e-12);
  CHECK(t.streaming());
  other = 0;
  for (unsigned i = 0; i < 4 * WriteTuner::kExplore; ++i) {
    const int w = t.next_way();
    other += 1 - w;
    t.record(w, w == 0 ? 10e-12 : 0.9e-12);
  }
  CHECK(other == 4);
  CHECK(t.streaming());

  // Back to fast plain copies: the probes see it and plain returns.
  for (unsigned i = 0; i < 8 * WriteTuner::kExplore && t.streaming(); ++i) {
    const int w = t.next_way();
    t.record(w, w == 0 ? 1e-12 : 0.9e-12);
  }
  CHECK_FALSE(t.streaming());
}

TEST_CASE("WriteTuner: one preempted copy moves the average at most 4x") {
  WriteTuner t;
  t.record(0, 0);  // first, not counted
  t.record(0, 1e-12);
  t.record(0, 1.0);  // a copy that lost its core for a second
  CHECK(t.seconds_per_byte(0) == doctest::Approx(0.75e-12 + 0.25 * 4e-12));
}
#endif

TEST_CASE("parse_stores: the three names, nothing else") {
  Stores s = Stores::plain;
  CHECK(parse_stores("auto", &s));
  CHECK(s == Stores::automatic);
  CHECK(parse_stores("streaming", &s));
  CHECK(s == Stores::streaming);
  CHECK(parse_stores("plain", &s));
  CHECK(s == Stores::plain);
  CHECK_FALSE(parse_stores("Plain", &s));
  CHECK_FALSE(parse_stores("", &s));
  CHECK(s == Stores::plain);
}
