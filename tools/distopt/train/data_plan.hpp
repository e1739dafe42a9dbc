// `distopt train`'s data plan, without a model or ranks: the epoch's steps,
// each rank's slice of a global batch and its loss weight, the micro-batches
// of gradient accumulation, the position a resume continues from, and the
// epoch's sample order. The Trainer (trainer.cpp) follows it; tests drive it
// alone (tests/cli/data_plan_test.cpp). Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace distopt::train {

/// One epoch over `train_count` samples in global batches of `global_batch`
/// (> 0): `steps` steps (drop_last: the whole batches; else the last,
/// partial one too, `partial` samples), capped at `max_steps` when > 0.
/// `steps` is 0 when not one batch fits (the Trainer refuses the job).
struct EpochPlan {
  int64_t steps = 0;
  int64_t partial = 0;  ///< samples of the last step when it is partial (drop_last false), else 0
};
EpochPlan plan_epoch(int64_t train_count, int64_t global_batch, bool drop_last, int64_t max_steps);

/// Rank `rank` of `world` ranks at `step` (0-based) of an epoch: the slice
/// [G r / W, G (r + 1) / W) of global batch `step` (G = global_batch), so the
/// ranks' slices tile the batch whatever W. `first`: index of its first
/// sample in the epoch's order; `count`: samples it has (fewer, or 0, in a
/// partial last batch); `share`: its slice's size; `loss_weight`: share x W
/// / G, the factor on its mean loss that makes the ranks' mean gradient the
/// batch's mean when W does not divide G (1 when it does).
struct RankSlice {
  int64_t first = 0, count = 0, share = 0;
  double loss_weight = 1;
};
RankSlice rank_slice(int64_t global_batch, int64_t world, int64_t rank, int64_t step,
                     int64_t train_count);

/// Gradient accumulation: micro-batch `k` of `k_total` over `count` samples
/// (k_total clamped to [1, count]): [begin, end), the micro-batches tiling
/// [0, count) in near-equal parts.
std::pair<int64_t, int64_t> micro_batch(int64_t count, int64_t k_total, int64_t k);
/// The number of micro-batches for `count` samples: `accumulation` clamped to [1, count].
int64_t micro_batches(int64_t count, int64_t accumulation);

/// Where a resumed run continues: a checkpoint saved at `samples_in_epoch`
/// samples of epoch `epoch` (1-based) read with this run's global batch and
/// steps per epoch. A position at or past the epoch's end continues with
/// the next epoch at step 0; samples of a partial global batch (the world
/// size or global batch changed) are skipped (`skipped`).
struct ResumePoint {
  int64_t epoch = 1, step = 0;
  int64_t skipped = 0;      ///< samples of a partial global batch left out
  bool epoch_done = false;  ///< the saved epoch was complete here
};
ResumePoint resume_point(int64_t epoch, int64_t samples_in_epoch, int64_t global_batch,
                         int64_t steps_per_epoch);

/// The same permutation of 0..n-1 on every rank and machine: Fisher-Yates
/// driven by a 64-bit Mersenne Twister (fully specified by the standard,
/// unlike the distributions), seeded from the job seed and the epoch.
std::vector<int64_t> epoch_permutation(int64_t n, int64_t seed, int64_t epoch);

}  // namespace distopt::train
