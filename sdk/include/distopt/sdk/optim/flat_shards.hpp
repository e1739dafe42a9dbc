// Sharding a list of tensors laid back to back (ZeRO's "contiguous"
// partition, FSDP's flat parameter): the flat range of all their elements is
// cut into W equal chunks of ceil(total / W) elements, rank r owning
// [r * chunk, (r + 1) * chunk); a tensor crossing a chunk boundary is split
// into pieces. After each rank updated what it owns, allgather_pieces gives
// every rank the whole (one allgather of W x chunk elements). For algorithms
// that shard optimizer state (hybrid's shard: true; zero's `contiguous`
// partition uses the same split, sdk/optim/flat_range.hpp). Torch.
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

/// Items of `numels` elements (>= 0) laid back to back, cut into `world`
/// equal chunks (sdk/optim/flat_range.hpp's split_range; a Piece's id is the
/// item's index, item_offset its first element in the item). Empty items get
/// no piece. Throws std::invalid_argument for world < 1 or a negative numel.
/// Pure, thread-safe.
inline RangeSplit shard_back_to_back(const std::vector<int64_t>& numels, int32_t world) {
  std::vector<size_t> sizes;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("flat shards: negative numel");
    sizes.push_back(static_cast<size_t>(n));
  }
  size_t total = 0;
  for (size_t n : sizes) total += n;
  return split_range(back_to_back(sizes), total, world);
}

/// Makes every rank's pieces whole on every rank: packs this rank's pieces
/// (view(piece): a contiguous 1-D tensor of piece.numel elements aliasing
/// the piece's memory, all of `dtype` and on one device) into a chunk on
/// that device, allgathers the W chunks through `comm`, and copies the other
/// ranks' pieces into their views. Blocks until done. Collective: every rank
/// calls it with the same shards. Returns the bytes this rank sent on a ring
/// allgather ((W - 1) x chunk bytes). Throws what the communicator throws.
inline uint64_t allgather_pieces(CommView& comm, const RangeSplit& shards, int32_t rank,
                                 int32_t world, at::ScalarType dtype,
                                 const std::function<at::Tensor(const Piece&)>& view) {
  if (world <= 1 || shards.chunk == 0 || shards.pieces.empty()) return 0;
  at::NoGradGuard ng;
  // On the pieces' device: a device-only communicator (nccl) takes no host staging.
  const auto opts = at::TensorOptions().dtype(dtype).device(view(shards.pieces.front()).device());
  const auto chunk = static_cast<int64_t>(shards.chunk);
  at::Tensor send = at::zeros({chunk}, opts);
  at::Tensor recv = at::empty({chunk * world}, opts);
  const auto i64 = [](size_t v) { return static_cast<int64_t>(v); };
  for (const Piece& p : shards.pieces)
    if (p.owner == rank) send.narrow(0, i64(p.chunk_offset), i64(p.numel)).copy_(view(p));
  DLView sv(send), rv(recv);
  comm.allgather(*sv.get(), *rv.get()).wait();
  for (const Piece& p : shards.pieces)
    if (p.owner != rank)
      view(p).copy_(recv.narrow(0, p.owner * chunk + i64(p.chunk_offset), i64(p.numel)));
  return static_cast<uint64_t>(send.nbytes()) * static_cast<uint64_t>(world - 1);
}

}  // namespace distopt::sdk
