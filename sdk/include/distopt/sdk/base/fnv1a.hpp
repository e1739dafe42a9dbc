// 64-bit FNV-1a (Fowler-Noll-Vo), for comparing across ranks what each was
// given (node names, the arguments of a collective call): unlike std::hash
// its value is specified, so every rank and build computes the same one.
// Not cryptographic: a collision makes two different inputs look equal.
// Torch-free, header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace distopt::sdk {

/// Accumulates bytes; not thread-safe (one per hashing thread).
class Fnv1a {
 public:
  /// Mix `n` bytes at `p`.
  Fnv1a& bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * kPrime;
    return *this;
  }
  /// Mix the characters of `s` (no terminator).
  Fnv1a& chars(const std::string& s) { return bytes(s.data(), s.size()); }
  /// Mix the characters of `s`, then a 0xff separator, so that ("ab", "c")
  /// and ("a", "bc") differ.
  Fnv1a& field(const std::string& s) {
    chars(s);
    const unsigned char sep = 0xff;
    return bytes(&sep, 1);
  }
  /// Mix the object representation of a trivially copyable value (an
  /// integer, a double: equal values of the same type hash equally).
  template <class T>
  Fnv1a& value(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "hash the bytes of plain values only");
    return bytes(&v, sizeof v);
  }
  uint64_t digest() const { return h_; }
  /// The digest's bits as an int64 (what a collective of int64 carries).
  int64_t digest_i64() const {
    int64_t out;
    std::memcpy(&out, &h_, sizeof out);
    return out;
  }

 private:
  static constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t h_ = 14695981039346656037ull;  // the 64-bit offset basis
};

}  // namespace distopt::sdk
