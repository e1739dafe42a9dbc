// Partitioning a flat range of elements (tensors laid back to back, or a
// gradient bucket with its items at their offsets) into W equal shards of
// ceil(length / W) elements, rank r's shard being [r * shard_numel,
// (r + 1) * shard_numel); an item crossing a shard boundary falls into
// several item shards, and the range is padded to W * shard_numel so
// allgather / reduce_scatter see equal counts. The rule of ZeRO's and FSDP's
// flat sharding; used by `zero` (its contiguous partition and stage 2
// buckets) and by sdk/optim/flat_shards.hpp (`hybrid`). Terms: a shard is
// one rank's part, the partition the split of the whole into shards.
// Header-only, torch-free; pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace distopt::sdk {

/// An item in a flat range: elements [offset, offset + numel) belong to
/// item `id` (e.g. a parameter index).
struct FlatItem {
  size_t id = 0;
  size_t offset = 0;
  size_t numel = 0;
};

/// The part of one item that lies in one rank's shard.
struct ItemShard {
  size_t id = 0;           ///< the item's id
  size_t item_offset = 0;  ///< first element within the item
  size_t numel = 0;
  int32_t owner = 0;        ///< the rank whose shard holds it
  size_t shard_offset = 0;  ///< first element within the owner's shard
};

/// A flat range partitioned into equal shards.
struct FlatPartition {
  size_t shard_numel = 0;              ///< elements per rank: ceil(length / world)
  std::vector<ItemShard> item_shards;  ///< ordered by offset in the range
};

/// Partitions a flat range of `length` elements holding `items`
/// (non-overlapping, within [0, length); gaps are padding) into `world`
/// equal shards. Throws std::invalid_argument for world < 1 or an item
/// outside the range or overlapping another.
inline FlatPartition partition_range(const std::vector<FlatItem>& items, size_t length,
                                     int32_t world) {
  if (world < 1) throw std::invalid_argument("flat range: world size must be >= 1");
  FlatPartition out;
  const auto w = static_cast<size_t>(world);
  out.shard_numel = (length + w - 1) / w;
  std::vector<FlatItem> sorted = items;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const FlatItem& a, const FlatItem& b) { return a.offset < b.offset; });
  size_t prev_end = 0;
  for (const auto& s : sorted) {
    if (s.offset + s.numel > length || s.offset < prev_end)
      throw std::invalid_argument("flat range: item " + std::to_string(s.id) + " [" +
                                  std::to_string(s.offset) + ", +" + std::to_string(s.numel) +
                                  ") overlaps another or leaves the range of " +
                                  std::to_string(length));
    prev_end = s.offset + s.numel;
    size_t pos = s.offset;
    const size_t end = s.offset + s.numel;
    while (pos < end) {
      const size_t r = pos / out.shard_numel;
      const size_t shard_end = (r + 1) * out.shard_numel;
      const size_t n = std::min(end, shard_end) - pos;
      out.item_shards.push_back(
          {s.id, pos - s.offset, n, static_cast<int32_t>(r), pos - r * out.shard_numel});
      pos += n;
    }
  }
  return out;
}

/// Items of the given sizes laid back to back (ids 0..n-1).
inline std::vector<FlatItem> back_to_back(const std::vector<size_t>& numels) {
  std::vector<FlatItem> items;
  size_t off = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    items.push_back({i, off, numels[i]});
    off += numels[i];
  }
  return items;
}

// 1.x names, from before the terms were made one (shard, partition): the
// same data under the old field names (chunk = shard_numel, pieces =
// item_shards, chunk_offset = shard_offset), so a plugin written against
// them compiles unchanged. New code uses the types above.
using Segment = FlatItem;  // 1.x alias (same fields)

/// 1.x name of ItemShard, with its old field names.
struct Piece {
  size_t id = 0;
  size_t item_offset = 0;
  size_t numel = 0;
  int32_t owner = 0;
  size_t chunk_offset = 0;  ///< ItemShard::shard_offset
  static Piece from(const ItemShard& s) {
    return {s.id, s.item_offset, s.numel, s.owner, s.shard_offset};
  }
  operator ItemShard() const { return {id, item_offset, numel, owner, chunk_offset}; }
};

/// 1.x name of FlatPartition, with its old field names.
struct RangeSplit {
  size_t chunk = 0;           ///< FlatPartition::shard_numel
  std::vector<Piece> pieces;  ///< FlatPartition::item_shards
  static RangeSplit from(const FlatPartition& p) {
    RangeSplit out;
    out.chunk = p.shard_numel;
    for (const ItemShard& s : p.item_shards) out.pieces.push_back(Piece::from(s));
    return out;
  }
  operator FlatPartition() const {
    FlatPartition out;
    out.shard_numel = chunk;
    out.item_shards.assign(pieces.begin(), pieces.end());
    return out;
  }
};

/// 1.x name of partition_range.
inline RangeSplit split_range(const std::vector<FlatItem>& items, size_t length, int32_t world) {
  return RangeSplit::from(partition_range(items, length, world));
}

}  // namespace distopt::sdk
