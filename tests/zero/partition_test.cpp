// ZeRO partitions (plugins/zero/partition.hpp): PyTorch's sorted-greedy and
// the equal contiguous ranges.
#include "partition.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <vector>

using namespace distopt::plugins::zero;

TEST_CASE(
    "greedy: PyTorch's sorted-greedy (largest first to the lightest rank, lowest rank on ties)") {
  // one group: 10, 7, 5, 5, 3, 1 over 2 ranks
  // 10 -> r0 (0,0); 7 -> r1; 5(#2) -> r1 (7 < 10); 5(#3) -> r0 (10 < 12); 3 -> r1 (12 < 15); 1 ->
  // r0 (15 = 15, lowest)
  std::vector<ParamSize> s = {{5, 0}, {10, 0}, {1, 0}, {7, 0}, {5, 0}, {3, 0}};
  auto owners = greedy_partition(s, 2);
  CHECK(owners == std::vector<int32_t>{1, 0, 0, 1, 0, 1});
  CHECK(rank_totals(s, owners, 2) == std::vector<size_t>{16, 15});
}

TEST_CASE("greedy: totals carry over from group to group; more ranks than parameters") {
  std::vector<ParamSize> s = {{8, 1}, {4, 0}, {4, 1}};
  // group 0: 4 -> r0; group 1: 8 -> r1, 4 -> r2
  CHECK(greedy_partition(s, 3) == std::vector<int32_t>{1, 0, 2});
  auto o = greedy_partition(s, 5);
  CHECK(rank_totals(s, o, 5) == std::vector<size_t>{4, 8, 4, 0, 0});
  CHECK_THROWS_AS(greedy_partition(s, 0), std::invalid_argument);
}

TEST_CASE("greedy: every rank within one largest parameter of the mean") {
  std::vector<ParamSize> s;
  size_t total = 0, largest = 0;
  for (size_t i = 0; i < 50; ++i) {
    size_t n = 1 + (i * 7919) % 1000;
    s.push_back({n, static_cast<int32_t>(i % 3)});
    total += n;
    largest = std::max(largest, n);
  }
  for (int32_t w : {2, 3, 4, 7}) {
    CAPTURE(w);
    auto t = rank_totals(s, greedy_partition(s, w), w);
    CHECK(std::accumulate(t.begin(), t.end(), size_t{0}) == total);
    for (size_t v : t)
      CHECK(std::abs(static_cast<double>(v) - static_cast<double>(total) / w) <= largest);
  }
}

TEST_CASE("partition_range: equal shards, items split at shard boundaries, every element once") {
  // 3 items of 5, 4, 2 back to back = 11 elements over 3 ranks -> shards of 4 (padded to 12)
  auto r = partition_range(back_to_back({5, 4, 2}), 11, 3);
  CHECK(r.shard_numel == 4);
  REQUIRE(r.item_shards.size() == 5);
  // item 0: [0,4) r0, [4,5) r1; item 1: [0,3) r1, [3,4) r2; item 2: [0,2) r2
  CHECK((r.item_shards[0].id == 0 && r.item_shards[0].item_offset == 0 &&
         r.item_shards[0].numel == 4 && r.item_shards[0].owner == 0));
  CHECK((r.item_shards[1].id == 0 && r.item_shards[1].item_offset == 4 &&
         r.item_shards[1].numel == 1 && r.item_shards[1].owner == 1 &&
         r.item_shards[1].shard_offset == 0));
  CHECK((r.item_shards[2].id == 1 && r.item_shards[2].item_offset == 0 &&
         r.item_shards[2].numel == 3 && r.item_shards[2].owner == 1 &&
         r.item_shards[2].shard_offset == 1));
  CHECK((r.item_shards[3].id == 1 && r.item_shards[3].item_offset == 3 &&
         r.item_shards[3].numel == 1 && r.item_shards[3].owner == 2));
  CHECK((r.item_shards[4].id == 2 && r.item_shards[4].numel == 2 && r.item_shards[4].owner == 2 &&
         r.item_shards[4].shard_offset == 1));
}

TEST_CASE("partition_range: gaps (bucket padding), coverage and balance over many shapes") {
  // a bucket: entries at aligned offsets with padding between them
  std::vector<FlatItem> items = {{7, 0, 3}, {2, 4, 6}, {9, 12, 5}};
  auto r = partition_range(items, 20, 4);
  CHECK(r.shard_numel == 5);
  std::map<size_t, size_t> covered;
  std::vector<size_t> per_rank(4, 0);
  for (const auto& p : r.item_shards) {
    covered[p.id] += p.numel;
    per_rank[static_cast<size_t>(p.owner)] += p.numel;
    CHECK(p.shard_offset + p.numel <= r.shard_numel);
    // the item shard's place in the range is its owner's shard start + shard_offset
    const auto& s =
        *std::find_if(items.begin(), items.end(), [&](const FlatItem& x) { return x.id == p.id; });
    CHECK(s.offset + p.item_offset ==
          static_cast<size_t>(p.owner) * r.shard_numel + p.shard_offset);
  }
  CHECK(covered == std::map<size_t, size_t>{{7, 3}, {2, 6}, {9, 5}});
  for (size_t n : {1, 2, 3, 10, 97, 1000})
    for (int32_t w : {1, 2, 3, 4, 8}) {
      CAPTURE(n);
      CAPTURE(w);
      auto rr = partition_range(back_to_back({n, 2 * n + 1}), 3 * n + 1, w);
      std::vector<size_t> t(static_cast<size_t>(w), 0);
      for (const auto& p : rr.item_shards) t[static_cast<size_t>(p.owner)] += p.numel;
      CHECK(std::accumulate(t.begin(), t.end(), size_t{0}) == 3 * n + 1);
      CHECK(*std::max_element(t.begin(), t.end()) ==
            rr.shard_numel);  // nobody holds more than a shard
      CHECK(rr.shard_numel * static_cast<size_t>(w) - (3 * n + 1) <
            static_cast<size_t>(w));  // padding < W
    }
  CHECK(partition_range({}, 0, 2).item_shards.empty());
  CHECK_THROWS_AS(partition_range({{0, 5, 10}}, 12, 2), std::invalid_argument);  // leaves the range
  CHECK_THROWS_AS(partition_range({{0, 0, 4}, {1, 2, 4}}, 12, 2),
                  std::invalid_argument);  // overlap
}

TEST_CASE("the 1.x names of the flat partition still compile and mean the same") {
  // Written as a plugin of the flat SDK (ABI 1.4) wrote it: old types, old fields.
  const distopt::sdk::RangeSplit old = distopt::sdk::split_range(back_to_back({5, 4, 2}), 11, 3);
  const FlatPartition now = partition_range(back_to_back({5, 4, 2}), 11, 3);
  CHECK(old.chunk == now.shard_numel);
  REQUIRE(old.pieces.size() == now.item_shards.size());
  for (size_t i = 0; i < old.pieces.size(); ++i) {
    const distopt::sdk::Piece& p = old.pieces[i];
    const ItemShard& s = now.item_shards[i];
    CHECK((p.id == s.id && p.item_offset == s.item_offset && p.numel == s.numel &&
           p.owner == s.owner && p.chunk_offset == s.shard_offset));
  }
  const FlatPartition back = old;  // and back to the new names
  CHECK(back.item_shards.size() == now.item_shards.size());
  CHECK(back.item_shards.back().shard_offset == now.item_shards.back().shard_offset);
  const distopt::sdk::Segment item{0, 0, 5};
  CHECK(old.pieces.front().id == item.id);
}
