// `distopt train`'s data plan (tools/distopt/train/data_plan.hpp), driven
// without a model or ranks: the ranks' slices tile every global batch and
// their loss weights make the ranks' mean gradient the batch's; partial
// last batches, max_steps, gradient-accumulation micro-batches, resume
// positions across world-size changes, and the epoch order.
#include "train/data_plan.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

using namespace distopt::train;

TEST_CASE("an epoch's steps: whole batches, the partial last one, max_steps") {
  CHECK(plan_epoch(1000, 100, true, 0).steps == 10);
  CHECK(plan_epoch(1000, 100, true, 0).partial == 0);
  EpochPlan p = plan_epoch(1050, 100, true, 0);
  CHECK(p.steps == 10);
  CHECK(p.partial == 0);
  p = plan_epoch(1050, 100, false, 0);
  CHECK(p.steps == 11);
  CHECK(p.partial == 50);
  p = plan_epoch(1050, 100, false, 4);
  CHECK(p.steps == 4);
  CHECK(p.partial == 0);  // the partial batch is past the cap
  p = plan_epoch(1050, 100, false, 11);
  CHECK(p.steps == 11);
  CHECK(p.partial == 50);
  CHECK(plan_epoch(99, 100, true, 0).steps == 0);  // refused by the Trainer
  CHECK(plan_epoch(99, 100, false, 0).steps == 1);
}

TEST_CASE("the ranks' slices tile each global batch, whatever the world size") {
  const int64_t count = 1000;
  for (int64_t g : {1, 7, 64, 100, 256}) {
    for (int64_t w = 1; w <= 5 && w <= g; ++w) {
      CAPTURE(g);
      CAPTURE(w);
      const int64_t steps = plan_epoch(count, g, false, 0).steps;
      std::vector<int> seen(count, 0);
      for (int64_t step = 0; step < steps; ++step) {
        int64_t taken = 0;
        for (int64_t r = 0; r < w; ++r) {
          const RankSlice s = rank_slice(g, w, r, step, count);
          CHECK(s.share >= g / w);
          CHECK(s.share <= g / w + 1);
          CHECK(s.count <= s.share);
          for (int64_t i = s.first; i < s.first + s.count; ++i) ++seen[i];
          taken += s.count;
          // Rank r's loss is its mean over `share` samples x loss_weight, and
          // the allreduce averages over W ranks: each sample of the batch
          // then counts 1 / G, as in one process with batch G.
          CHECK(s.loss_weight / static_cast<double>(w * s.share) ==
                doctest::Approx(1.0 / static_cast<double>(g)));
        }
        CHECK(taken == std::min<int64_t>(g, count - step * g));
      }
      // Every sample once (the partial last batch included).
      CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST_CASE("a rank past the data in the partial last batch has nothing") {
  // 1050 samples, global batch 100, 4 ranks: the last batch has 50 samples,
  // ranks 0 and 1 (slices of 25) take them, ranks 2 and 3 none (they join).
  CHECK(rank_slice(100, 4, 0, 10, 1050).count == 25);
  CHECK(rank_slice(100, 4, 1, 10, 1050).count == 25);
  CHECK(rank_slice(100, 4, 2, 10, 1050).count == 0);
  CHECK(rank_slice(100, 4, 3, 10, 1050).count == 0);
}

TEST_CASE("gradient accumulation's micro-batches tile the rank's samples") {
  for (int64_t count : {1, 5, 64, 65}) {
    for (int64_t k : {1, 2, 3, 8, 100}) {
      CAPTURE(count);
      CAPTURE(k);
      const int64_t n = micro_batches(count, k);
      CHECK(n == std::clamp<int64_t>(k, 1, count));
      int64_t next = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto [b, e] = micro_batch(count, k, i);
        CHECK(b == next);
        CHECK(e > b);  // none empty
        next = e;
      }
      CHECK(next == count);
    }
  }
  CHECK(micro_batches(10, 0) == 1);
}

TEST_CASE("a resume continues at the saved sample, rounded down to a whole global batch") {
  // Saved by 4 ranks x 64 after 3 steps of epoch 2 (768 samples).
  ResumePoint r = resume_point(2, 768, 256, 10);
  CHECK(r.epoch == 2);
  CHECK(r.step == 3);
  CHECK(r.skipped == 0);
  CHECK_FALSE(r.epoch_done);
  // Resumed by 3 ranks x 64 (global 192): step 4, nothing skipped.
  r = resume_point(2, 768, 192, 13);
  CHECK(r.step == 4);
  CHECK(r.skipped == 0);
  // Resumed by 5 ranks x 64 (global 320): step 2, 128 samples skipped.
  r = resume_point(2, 768, 320, 8);
  CHECK(r.step == 2);
  CHECK(r.skipped == 128);
  // A position at or past this run's epoch end: the next epoch from its start.
  r = resume_point(2, 2560, 256, 10);
  CHECK(r.epoch_done);
  CHECK(r.epoch == 3);
  CHECK(r.step == 0);
  CHECK(r.skipped == 0);
  r = resume_point(1, 768, 256, 2);  // train.max_steps smaller than where it stopped
  CHECK(r.epoch_done);
  CHECK(r.epoch == 2);
}

TEST_CASE("the epoch order: a permutation, the same for a seed and epoch, new each epoch") {
  const auto a = epoch_permutation(1000, 7, 1);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);
  CHECK(epoch_permutation(1000, 7, 1) == a);
  CHECK(epoch_permutation(1000, 7, 2) != a);
  CHECK(epoch_permutation(1000, 8, 1) != a);
  // Fixed by the standard's mt19937_64: the same on every machine.
  const auto small = epoch_permutation(5, 0, 1);
  CHECK(std::set<int64_t>(small.begin(), small.end()).size() == 5);
  CHECK(epoch_permutation(0, 0, 1).empty());
}
