// A flat range of elements (tensors laid back to back, or a gradient bucket
// with its entries at their offsets) cut into W equal chunks of
// ceil(length / W) elements, rank r owning [r * chunk, (r + 1) * chunk);
// a segment crossing a chunk boundary is split into pieces, and the range is
// padded to W * chunk so allgather / reduce_scatter see equal counts. The
// rule of ZeRO's and FSDP's flat sharding; used by `zero` (its contiguous
// partition and stage 2 buckets) and by sdk/optim/flat_shards.hpp (`hybrid`).
// Header-only, torch-free; pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace distopt::sdk {

/// A segment of a flat range: elements [offset, offset + numel) belong to
/// item `id` (e.g. a parameter index).
struct Segment {
  size_t id = 0;
  size_t offset = 0;
  size_t numel = 0;
};

/// The part of a segment one rank owns.
struct Piece {
  size_t id = 0;           ///< the segment's id
  size_t item_offset = 0;  ///< first element within the segment's item
  size_t numel = 0;
  int32_t owner = 0;
  size_t chunk_offset = 0;  ///< first element within the owner's chunk
};

struct RangeSplit {
  size_t chunk = 0;           ///< elements per rank: ceil(length / world)
  std::vector<Piece> pieces;  ///< ordered by offset in the range
};

/// Split a flat range of `length` elements holding `segments` (non-overlapping,
/// within [0, length); gaps are padding) into `world` equal chunks. Throws
/// std::invalid_argument for world < 1 or a segment outside the range or
/// overlapping another.
inline RangeSplit split_range(const std::vector<Segment>& segments, size_t length, int32_t world) {
  if (world < 1) throw std::invalid_argument("flat range: world size must be >= 1");
  RangeSplit out;
  const auto w = static_cast<size_t>(world);
  out.chunk = (length + w - 1) / w;
  std::vector<Segment> sorted = segments;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  size_t prev_end = 0;
  for (const auto& s : sorted) {
    if (s.offset + s.numel > length || s.offset < prev_end)
      throw std::invalid_argument("flat range: segment " + std::to_string(s.id) + " [" +
                                  std::to_string(s.offset) + ", +" + std::to_string(s.numel) +
                                  ") overlaps another or leaves the range of " +
                                  std::to_string(length));
    prev_end = s.offset + s.numel;
    size_t pos = s.offset;
    const size_t end = s.offset + s.numel;
    while (pos < end) {
      const size_t r = pos / out.chunk;
      const size_t chunk_end = (r + 1) * out.chunk;
      const size_t n = std::min(end, chunk_end) - pos;
      out.pieces.push_back({s.id, pos - s.offset, n, static_cast<int32_t>(r), pos - r * out.chunk});
      pos += n;
    }
  }
  return out;
}

/// Segments for items of the given sizes laid back to back (ids 0..n-1).
inline std::vector<Segment> back_to_back(const std::vector<size_t>& numels) {
  std::vector<Segment> segs;
  size_t off = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    segs.push_back({i, off, numels[i]});
    off += numels[i];
  }
  return segs;
}

}  // namespace distopt::sdk
