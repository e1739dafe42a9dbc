// Keyed UCP tags: UCP matches a tagged message to a posted receive by its
// 64-bit tag alone, whichever endpoint (or stranger) sent it, so a process
// that can reach a worker's port and knows the tag layout can complete the
// job's receives with its own bytes. UcpTransport therefore puts on the
// wire not the layout's tag but its image under a permutation keyed by the
// job token: a 4-round Feistel network on 32-bit halves whose round
// function is SipHash-2-4 (Aumasson & Bernstein 2012, a PRF) keyed by
// SipHash of the token (Luby-Rackoff: 4 rounds of a PRF give a strong
// pseudo-random permutation). A bijection, so distinct layout tags stay
// distinct; without the token a forged tag matches a posted receive with
// probability 2^-64 per try. Not a MAC: the payload is not authenticated,
// and whoever sees the traffic sees the tags (and may replay them).
// Header-only; thread-safe (const after construction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace distopt::plugins::ucx {

/// SipHash-2-4 of `n` bytes at `m` under the key (k0, k1).
inline uint64_t siphash24(uint64_t k0, uint64_t k1, const void* m, size_t n) {
  auto rotl = [](uint64_t x, int b) { return (x << b) | (x >> (64 - b)); };
  uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull,
           v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
  auto round = [&] {
    v0 += v1, v1 = rotl(v1, 13), v1 ^= v0, v0 = rotl(v0, 32);
    v2 += v3, v3 = rotl(v3, 16), v3 ^= v2;
    v0 += v3, v3 = rotl(v3, 21), v3 ^= v0;
    v2 += v1, v1 = rotl(v1, 17), v1 ^= v2, v2 = rotl(v2, 32);
  };
  auto block = [&](uint64_t w) {
    v3 ^= w;
    round();
    round();
    v0 ^= w;
  };
  const auto* p = static_cast<const unsigned char*>(m);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    for (int b = 0; b < 8; ++b) w |= uint64_t{p[i + b]} << (8 * b);  // little-endian
    block(w);
  }
  uint64_t last = uint64_t{n & 0xff} << 56;
  for (int b = 0; i + b < n; ++b) last |= uint64_t{p[i + b]} << (8 * b);
  block(last);
  v2 ^= 0xff;
  for (int r = 0; r < 4; ++r) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

/// The permutation of 64-bit tags keyed by a job token ("" is a key too,
/// a public one: a job without a token gets no protection from it).
class TagCipher {
 public:
  explicit TagCipher(const std::string& token)
      : k0_(siphash24(0x6469737430707421ull, 0x7563782d74616773ull, token.data(), token.size())),
        k1_(siphash24(0x7563782d74616773ull, 0x6469737430707421ull, token.data(), token.size())) {}

  /// The wire tag of layout tag `tag`.
  uint64_t operator()(uint64_t tag) const {
    uint32_t l = static_cast<uint32_t>(tag >> 32), r = static_cast<uint32_t>(tag);
    for (uint64_t i = 0; i < 4; ++i) {
      const uint64_t in = (i << 32) | r;
      unsigned char bytes[8];  // little-endian on every host
      for (int b = 0; b < 8; ++b) bytes[b] = static_cast<unsigned char>(in >> (8 * b));
      const uint32_t f = static_cast<uint32_t>(siphash24(k0_, k1_, bytes, sizeof bytes));
      const uint32_t next = l ^ f;
      l = r;
      r = next;
    }
    return (uint64_t{l} << 32) | r;
  }

 private:
  uint64_t k0_, k1_;
};

}  // namespace distopt::plugins::ucx
