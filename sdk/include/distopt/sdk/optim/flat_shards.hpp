// Sharding a list of tensors laid back to back (ZeRO's "contiguous"
// partition, FSDP's flat parameter): the flat range of all their elements is
// partitioned into W equal shards of ceil(total / W) elements, rank r's shard
// being [r * shard_numel, (r + 1) * shard_numel); a tensor crossing a shard
// boundary falls into several item shards. After each rank updated its
// shard, allgather_shards gives every rank the whole (one allgather of
// W x shard_numel elements). For algorithms that shard optimizer state
// (hybrid's shard: true; zero's `contiguous` partition uses the same
// partition, sdk/optim/flat_range.hpp). Torch.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "distopt/sdk/base/comm.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/flat_range.hpp"

namespace distopt::sdk {

/// Items of `numels` elements (>= 0) laid back to back, partitioned into
/// `world` equal shards (sdk/optim/flat_range.hpp's partition_range; an
/// ItemShard's id is the item's index, item_offset its first element in the
/// item). Empty items get no item shard. Throws std::invalid_argument for
/// world < 1 or a negative numel. Pure, thread-safe.
inline FlatPartition partition_back_to_back(const std::vector<int64_t>& numels, int32_t world) {
  std::vector<size_t> sizes;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("flat shards: negative numel");
    sizes.push_back(static_cast<size_t>(n));
  }
  size_t total = 0;
  for (size_t n : sizes) total += n;
  return partition_range(back_to_back(sizes), total, world);
}

/// Makes every rank's shard whole on every rank: packs this rank's item
/// shards (view(s): a contiguous 1-D tensor of s.numel elements aliasing the
/// item shard's memory, all of `dtype` and on one device) into a shard on
/// that device, allgathers the W shards through `comm`, and copies the other
/// ranks' item shards into their views. Blocks until done. Collective: every
/// rank calls it with the same partition. Returns the bytes this rank sent
/// on a ring allgather ((W - 1) x shard bytes; 0 at world 1 or for an empty
/// partition). Throws what the communicator throws.
inline uint64_t allgather_shards(CommView& comm, const FlatPartition& partition, int32_t rank,
                                 int32_t world, at::ScalarType dtype,
                                 const std::function<at::Tensor(const ItemShard&)>& view) {
  if (world <= 1 || partition.shard_numel == 0 || partition.item_shards.empty()) return 0;
  at::NoGradGuard ng;
  // On the item shards' device: a device-only communicator (nccl) takes no host staging.
  const auto opts =
      at::TensorOptions().dtype(dtype).device(view(partition.item_shards.front()).device());
  const auto shard_numel = static_cast<int64_t>(partition.shard_numel);
  at::Tensor send = at::zeros({shard_numel}, opts);
  at::Tensor recv = at::empty({shard_numel * world}, opts);
  const auto i64 = [](size_t v) { return static_cast<int64_t>(v); };
  for (const ItemShard& s : partition.item_shards)
    if (s.owner == rank) send.narrow(0, i64(s.shard_offset), i64(s.numel)).copy_(view(s));
  DLView sv(send), rv(recv);
  comm.allgather(*sv.get(), *rv.get()).wait();
  for (const ItemShard& s : partition.item_shards)
    if (s.owner != rank)
      view(s).copy_(recv.narrow(0, s.owner * shard_numel + i64(s.shard_offset), i64(s.numel)));
  return static_cast<uint64_t>(send.nbytes()) * static_cast<uint64_t>(world - 1);
}

/// 1.x name of partition_back_to_back (the old types, flat_range.hpp).
inline RangeSplit shard_back_to_back(const std::vector<int64_t>& numels, int32_t world) {
  return RangeSplit::from(partition_back_to_back(numels, world));
}
/// 1.x name of allgather_shards (the old types, flat_range.hpp).
inline uint64_t allgather_pieces(CommView& comm, const RangeSplit& shards, int32_t rank,
                                 int32_t world, at::ScalarType dtype,
                                 const std::function<at::Tensor(const Piece&)>& view) {
  return allgather_shards(comm, shards, rank, world, dtype,
                          [&](const ItemShard& s) { return view(Piece::from(s)); });
}

}  // namespace distopt::sdk
