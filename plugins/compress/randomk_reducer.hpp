// `randomk` reducer: random-k sparsification with error feedback, after
// mlbench's SparsifiedSGD / CentralizedSparsifiedSGD with random selection
// (Stich, Cordonnier, Jaggi, "Sparsified SGD with memory", NeurIPS 2018).
//
// Per bucket entry t (n_t elements), k = min(n_t, max(min_k, ceil(ratio x
// n_t))). Every
// rank draws the SAME k distinct indices S (splitmix64 seeded from the
// `seed` option, the bucket index, the bucket's reduction count and t;
// sorted ascending), so only the values travel:
//   u = momentum x u + g (momentum > 0: DGC momentum correction; else u = g)
//   p = u + e;  v = p[S];  e = p with S set to 0 (error_feedback: true)
//   u = u with S set to 0 (momentum_masking)
//   one allreduce (DOPT_REDUCE_AVG, float32) of all entries' v;
//   out = 0 everywhere except out[S] = mean_r v_r.
// No n/k rescaling (the memory variant: what is not sent now is sent later).
//
// bytes_sent per bucket: a ring allreduce of 4 x sum_t k_t bytes,
// 2 (W-1)/W x 4 x sum_t k_t.
// Options: ratio, min_k, error_feedback, momentum, momentum_masking as topk
// (topk_reducer.hpp), seed (int >= 0, default 0; must match on every rank).
// State: the residuals (error feedback) and each bucket's reduction count,
// which with `seed` fully determines the draws (counter-based, so there is
// no generator state to keep); checkpoints hold both (save_state).
// Bucket dtypes and thread safety as topk.
// kernels (auto | cpu | generic; compress_common.hpp): the generic path
// draws the same indices on the host (random_subset: counter-based, so they
// do not depend on the device or a device generator) and moves them to the
// bucket's device (k int64 per step, host to device); the values, the
// allreduce and the scatter run there. Bit-identical to the CPU kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "compress_common.hpp"

namespace distopt::plugins::compress {

/// The k distinct indices in [0, n) randomk draws, sorted (deterministic in
/// its arguments on every machine). Exposed for the tests.
std::vector<uint32_t> random_subset(uint64_t seed, uint64_t bucket, uint64_t step, uint64_t entry,
                                    size_t n, size_t k);

class RandomkReducer : public CompressReducer {
 public:
  RandomkReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
                 size_t num_buckets);
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override;
  /// Checkpoints: per parameter, "randomk/step/<param name>" (int64 scalar,
  /// its bucket's reduction count: the same on every rank, so put by rank 0
  /// only as a whole SHARDED tensor) and, with error_feedback, the RANK_LOCAL
  /// float32 "error_feedback/<param name>" (CompressReducer::load_residuals).
  /// Restoring the count makes the next draws the ones an uninterrupted run
  /// would make. A missing count is a warning and 0; parameters of one
  /// bucket with different saved counts (the bucket layout changed) take the
  /// largest, with a warning. Between steps only.
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;

 private:
  std::vector<at::Tensor> residuals();
  std::unique_ptr<sdk::Request> reduce_generic(size_t b, const dopt_bucket& bucket);

  struct State {
    std::vector<float> work, values;
    at::Tensor residual;          // float32, the bucket's device (error feedback only)
    std::vector<uint32_t> index;  // flat-buffer index of each value
    uint64_t step = 0;            // reductions of this bucket so far
    int64_t shape = 0;
    DLTensor dl{};
    sdk::DLView values_view;  // generic path: the float32 values on the device
  };
  SparseOptions opts_;
  bool error_feedback_;
  MomentumCorrection momentum_;
  uint64_t seed_;
  std::vector<State> state_;
};

}  // namespace distopt::plugins::compress
