// `distopt train`'s data plan (data_plan.hpp).
#include "train/data_plan.hpp"

#include <algorithm>
#include <numeric>
#include <random>

namespace distopt::train {

EpochPlan plan_epoch(int64_t train_count, int64_t global_batch, bool drop_last, int64_t max_steps) {
  EpochPlan p;
  if (global_batch <= 0 || train_count <= 0) return p;
  p.partial = drop_last ? 0 : train_count % global_batch;
  p.steps = train_count / global_batch + (p.partial > 0 ? 1 : 0);
  if (max_steps > 0 && max_steps < p.steps) {
    p.steps = max_steps;
    p.partial = 0;  // the partial last batch is beyond the cap
  }
  return p;
}

RankSlice rank_slice(int64_t global_batch, int64_t world, int64_t rank, int64_t step,
                     int64_t train_count) {
  RankSlice s;
  const int64_t lo = global_batch * rank / world;
  s.share = global_batch * (rank + 1) / world - lo;
  s.first = step * global_batch + lo;
  s.count = std::clamp<int64_t>(train_count - s.first, 0, s.share);
  s.loss_weight = s.share * world == global_batch
                      ? 1.0
                      : static_cast<double>(s.share * world) / static_cast<double>(global_batch);
  return s;
}

int64_t micro_batches(int64_t count, int64_t accumulation) {
  return std::clamp<int64_t>(accumulation, 1, std::max<int64_t>(1, count));
}

std::pair<int64_t, int64_t> micro_batch(int64_t count, int64_t k_total, int64_t k) {
  const int64_t n = micro_batches(count, k_total);
  return {count * k / n, count * (k + 1) / n};
}

ResumePoint resume_point(int64_t epoch, int64_t samples_in_epoch, int64_t global_batch,
                         int64_t steps_per_epoch) {
  ResumePoint r;
  r.epoch = epoch;
  r.step = samples_in_epoch / global_batch;
  r.epoch_done = r.step >= steps_per_epoch;
  r.skipped = r.epoch_done ? 0 : samples_in_epoch % global_batch;
  if (r.epoch_done) {
    ++r.epoch;
    r.step = 0;
  }
  return r;
}

std::vector<int64_t> epoch_permutation(int64_t n, int64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 gen(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull +
                      static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

}  // namespace distopt::train
