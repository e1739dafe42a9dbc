// 8-bit min-max quantization per chunk: the compressor of low-precision
// decentralized SGD (Bagua's MinMaxUInt8, used by its
// LowPrecisionDecentralizedAlgorithm; Tang et al., "Communication Compression
// for Decentralized Training", NeurIPS 2018). Each chunk of `chunk` floats is
// sent as its minimum and maximum and one byte per element, the index of the
// nearest of 256 evenly spaced levels from min to max. Torch-free.
//
// Differences from Bagua's kernel: Bagua quantizes a whole bucket with one
// min/max and truncates (error up to one level); this codec rounds to the
// nearest level (error at most half a level) and keeps a min/max per chunk,
// so one outlier only coarsens its own chunk.
//
// Wire layout for n elements in C = ceil(n / chunk) chunks (host byte order;
// every rank of a job runs on the same architecture):
//   C pairs of float32 (min, max), then n uint8 codes, chunk after chunk.
//
// Determinism: decoding is a pure function of the bytes, evaluated as
//   float(double(min) + double(code) * (double(max) - double(min)) / 255)
// whose division between the product and the sum leaves no a*b+c that a
// compiler could fuse, so every rank decodes the same bytes to the same
// floats bitwise (the low-precision algorithm relies on it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace distopt::plugins::decentralized {

/// Elements per chunk the decentralized plugin uses: 8 header bytes per
/// 1024 codes, so a message is 1032/4096 = 25.2% of float32's.
inline constexpr size_t kMinMaxChunk = 1024;

/// Bytes of the encoding of `n` floats in chunks of `chunk` (> 0):
/// 8 * ceil(n / chunk) + n. Thread-safe.
size_t minmax_uint8_bytes(size_t n, size_t chunk);

/// Encode x[0..n) into out[0..minmax_uint8_bytes(n, chunk)). A chunk with a
/// non-finite value is sent as min = max = NaN (it decodes to NaN, as an
/// fp32 exchange would propagate it). A constant chunk decodes exactly.
/// Throws std::invalid_argument for chunk == 0. Thread-safe (distinct
/// buffers).
void minmax_uint8_encode(const float* x, size_t n, size_t chunk, uint8_t* out);

/// Decode what minmax_uint8_encode wrote for the same n and chunk into
/// x[0..n). |decoded - original| <= (max - min) / 510 of its chunk, plus half
/// a float32 ulp of the decoded value. Throws std::invalid_argument for
/// chunk == 0. Thread-safe (distinct buffers).
void minmax_uint8_decode(const uint8_t* in, size_t n, size_t chunk, float* x);

/// x[i] += the decoded value, for i in [0, n): bitwise what decoding into a
/// buffer and adding it would give (one float add per element), in one
/// pass. Errors and thread safety as minmax_uint8_decode.
void minmax_uint8_decode_add(const uint8_t* in, size_t n, size_t chunk, float* x);

}  // namespace distopt::plugins::decentralized
