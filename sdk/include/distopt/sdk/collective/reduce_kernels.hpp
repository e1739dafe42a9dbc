// Element-wise reductions for the dtypes distopt's host-memory communicators
// support (float32, float64, bfloat16, float16, int32, int64), shared by
// `tcp` and the p2p collectives (p2p_collectives.hpp). bfloat16 and float16
// are widened to float for the arithmetic and rounded back
// (round-to-nearest-even), so every reduction step rounds once.
// Header-only: the float loops are optimised at -O3 (GCC pragma below,
// whatever the including target's level) and cloned for AVX2 on x86-64 GCC
// (target_clones: one binary, the best loop chosen at load time).
// Thread safety: pure functions on caller memory.
#pragma once

#include <dlpack/dlpack.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "distopt/communicator.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3")
#endif

namespace distopt::sdk {

/// The reducible dtypes.
enum class DType { F32, F64, BF16, F16, I32, I64 };

namespace reduce_detail {

// Not under ThreadSanitizer: the ifunc resolver is instrumented and runs
// during relocation, before the TSan runtime is up (a crash at load time).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DOPT_SDK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DOPT_SDK_CLONES
#endif

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f(uint16_t h) { return from_bits(uint32_t(h) << 16); }
inline uint16_t f_to_bf16(float f) {
  uint32_t u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half <-> float, branch-free (after Maratyszcza's FP16 library).
inline float f16_to_f(uint16_t h) {
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? bits(denormalized) : bits(normalized));
  return from_bits(r);
}
inline uint16_t f_to_f16(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = bits(base);
  const uint32_t nonsign = ((b >> 13) & 0x7C00u) + (b & 0x0FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

struct Sum {
  template <class T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct Min {
  template <class T>
  static T apply(T a, T b) {
    return b < a ? b : a;
  }
};
struct Max {
  template <class T>
  static T apply(T a, T b) {
    return a < b ? b : a;
  }
};

// Plain types. Separate loops for the common cases keep them vectorisable.
template <class T, class Op>
inline void loop(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}
template <class T>
inline void div_loop(T* dst, size_t n, int d) {
  const T dv = static_cast<T>(d);
  for (size_t i = 0; i < n; ++i) dst[i] = dst[i] / dv;
}

DOPT_SDK_CLONES inline void f32_sum(float* d, const float* a, const float* b, size_t n) {
  loop<float, Sum>(d, a, b, n);
}
DOPT_SDK_CLONES inline void f32_min(float* d, const float* a, const float* b, size_t n) {
  loop<float, Min>(d, a, b, n);
}
DOPT_SDK_CLONES inline void f32_max(float* d, const float* a, const float* b, size_t n) {
  loop<float, Max>(d, a, b, n);
}
DOPT_SDK_CLONES inline void f32_div(float* d, size_t n, int v) { div_loop<float>(d, n, v); }
DOPT_SDK_CLONES inline void f64_sum(double* d, const double* a, const double* b, size_t n) {
  loop<double, Sum>(d, a, b, n);
}
DOPT_SDK_CLONES inline void f64_min(double* d, const double* a, const double* b, size_t n) {
  loop<double, Min>(d, a, b, n);
}
DOPT_SDK_CLONES inline void f64_max(double* d, const double* a, const double* b, size_t n) {
  loop<double, Max>(d, a, b, n);
}
DOPT_SDK_CLONES inline void f64_div(double* d, size_t n, int v) { div_loop<double>(d, n, v); }

template <class T>
inline void plain(dopt_reduce_op op, T* d, const T* a, const T* b, size_t n, int divisor) {
  switch (op) {
    case DOPT_REDUCE_MIN:
      loop<T, Min>(d, a, b, n);
      break;
    case DOPT_REDUCE_MAX:
      loop<T, Max>(d, a, b, n);
      break;
    default:
      loop<T, Sum>(d, a, b, n);
      break;
  }
  if (divisor > 1) div_loop<T>(d, n, divisor);
}

// 16-bit floats: widen, combine, optionally divide, round once.
template <float (*Load)(uint16_t), uint16_t (*StoreF)(float)>
DOPT_SDK_CLONES inline void half_loop(dopt_reduce_op op, uint16_t* d, const uint16_t* a,
                                      const uint16_t* b, size_t n, int divisor) {
  const float inv = divisor > 1 ? static_cast<float>(divisor) : 1.0f;
  switch (op) {
    case DOPT_REDUCE_MIN:
      for (size_t i = 0; i < n; ++i) d[i] = StoreF(Min::apply(Load(a[i]), Load(b[i])));
      break;
    case DOPT_REDUCE_MAX:
      for (size_t i = 0; i < n; ++i) d[i] = StoreF(Max::apply(Load(a[i]), Load(b[i])));
      break;
    default:
      if (divisor > 1)
        for (size_t i = 0; i < n; ++i) d[i] = StoreF((Load(a[i]) + Load(b[i])) / inv);
      else
        for (size_t i = 0; i < n; ++i) d[i] = StoreF(Load(a[i]) + Load(b[i]));
      break;
  }
}

}  // namespace reduce_detail

/// Map a DLPack dtype (lanes must be 1) to ours; false if unsupported.
inline bool dtype_from_dl(DLDataType t, DType* out) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32)
    *out = DType::F32;
  else if (t.code == kDLFloat && t.bits == 64)
    *out = DType::F64;
  else if (t.code == kDLFloat && t.bits == 16)
    *out = DType::F16;
  else if (t.code == kDLBfloat && t.bits == 16)
    *out = DType::BF16;
  else if (t.code == kDLInt && t.bits == 32)
    *out = DType::I32;
  else if (t.code == kDLInt && t.bits == 64)
    *out = DType::I64;
  else
    return false;
  return true;
}

/// Bytes per element.
inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
      return 8;
    case DType::F32:
    case DType::I32:
      return 4;
    default:
      return 2;
  }
}

/// "float32", "float64", "bfloat16", "float16", "int32", "int64".
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::F64:
      return "float64";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    case DType::I32:
      return "int32";
    default:
      return "int64";
  }
}

/// dst[i] = a[i] (op) b[i] for i < n; then, if divisor > 1, dst[i] /= divisor
/// (the final step of an average; integer types truncate toward zero).
/// dst may alias a or b exactly (in-place); other overlaps are not allowed.
/// DOPT_REDUCE_AVG must be passed as DOPT_REDUCE_SUM plus a divisor.
inline void reduce(DType t, dopt_reduce_op op, void* dst, const void* a, const void* b, size_t n,
                   int divisor) {
  switch (t) {
    case DType::F32: {
      auto* d = static_cast<float*>(dst);
      auto* x = static_cast<const float*>(a);
      auto* y = static_cast<const float*>(b);
      if (op == DOPT_REDUCE_MIN)
        reduce_detail::f32_min(d, x, y, n);
      else if (op == DOPT_REDUCE_MAX)
        reduce_detail::f32_max(d, x, y, n);
      else
        reduce_detail::f32_sum(d, x, y, n);
      if (divisor > 1) reduce_detail::f32_div(d, n, divisor);
      break;
    }
    case DType::F64: {
      auto* d = static_cast<double*>(dst);
      auto* x = static_cast<const double*>(a);
      auto* y = static_cast<const double*>(b);
      if (op == DOPT_REDUCE_MIN)
        reduce_detail::f64_min(d, x, y, n);
      else if (op == DOPT_REDUCE_MAX)
        reduce_detail::f64_max(d, x, y, n);
      else
        reduce_detail::f64_sum(d, x, y, n);
      if (divisor > 1) reduce_detail::f64_div(d, n, divisor);
      break;
    }
    case DType::I32:
      reduce_detail::plain(op, static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                           static_cast<const int32_t*>(b), n, divisor);
      break;
    case DType::I64:
      reduce_detail::plain(op, static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                           static_cast<const int64_t*>(b), n, divisor);
      break;
    case DType::BF16:
      reduce_detail::half_loop<reduce_detail::bf16_to_f, reduce_detail::f_to_bf16>(
          op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n, divisor);
      break;
    case DType::F16:
      reduce_detail::half_loop<reduce_detail::f16_to_f, reduce_detail::f_to_f16>(
          op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n, divisor);
      break;
  }
}

/// dst[i] = src[i] / divisor (dst may equal src; divisor <= 1: a copy).
inline void divide(DType t, void* dst, const void* src, size_t n, int divisor) {
  if (dst != src) std::memcpy(dst, src, n * dtype_size(t));
  if (divisor <= 1) return;
  switch (t) {
    case DType::F32:
      reduce_detail::f32_div(static_cast<float*>(dst), n, divisor);
      break;
    case DType::F64:
      reduce_detail::f64_div(static_cast<double*>(dst), n, divisor);
      break;
    case DType::I32:
      reduce_detail::div_loop(static_cast<int32_t*>(dst), n, divisor);
      break;
    case DType::I64:
      reduce_detail::div_loop(static_cast<int64_t*>(dst), n, divisor);
      break;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i)
        d[i] =
            reduce_detail::f_to_bf16(reduce_detail::bf16_to_f(d[i]) / static_cast<float>(divisor));
      break;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i)
        d[i] = reduce_detail::f_to_f16(reduce_detail::f16_to_f(d[i]) / static_cast<float>(divisor));
      break;
    }
  }
}

}  // namespace distopt::sdk

#undef DOPT_SDK_CLONES
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
