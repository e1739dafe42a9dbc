// Partitioning the trainable parameters of a ZeRO optimizer across W ranks.
// Torch-free, so it is unit-testable on its own (tests/zero/partition_test.cpp).
//
// Two partitions (after PyTorch's ZeroRedundancyOptimizer and ZeRO / FSDP):
//   greedy_partition     whole parameters; PyTorch's
//                        ZeroRedundancyOptimizer._partition_parameters: per
//                        param group, parameters sorted by numel (descending,
//                        stable), each given to the rank with the smallest
//                        running total (ties: the lowest rank); the totals
//                        carry over from group to group.
//   partition_range      a flat range of `length` elements (the parameters laid
//                        back to back, or one gradient bucket with its entries
//                        at their offsets) cut into W equal shards of
//                        ceil(length / W) elements; rank r's shard is
//                        [r * shard_numel, (r + 1) * shard_numel). A parameter
//                        that crosses a shard boundary falls into several item
//                        shards. The range is padded to W * shard_numel so
//                        allgather / reduce_scatter see equal counts.
// All functions are pure; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "distopt/sdk/optim/flat_range.hpp"

namespace distopt::plugins::zero {

/// One parameter as the greedy partition sees it.
struct ParamSize {
  size_t numel = 0;
  int32_t group = 0;  // param group index (groups are processed in increasing order)
};

/// Owner rank of each parameter (result[i] for sizes[i]). world >= 1, else
/// throws std::invalid_argument.
std::vector<int32_t> greedy_partition(const std::vector<ParamSize>& sizes, int32_t world);

/// Elements each rank owns under `owners` (size `world`).
std::vector<size_t> rank_totals(const std::vector<ParamSize>& sizes,
                                const std::vector<int32_t>& owners, int32_t world);

// partition_range, back_to_back and their types are the SDK's (sdk/optim/flat_range.hpp).
using sdk::back_to_back;
using sdk::FlatItem;
using sdk::FlatPartition;
using sdk::ItemShard;
using sdk::partition_range;

}  // namespace distopt::plugins::zero
