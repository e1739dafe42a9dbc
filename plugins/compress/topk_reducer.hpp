// `topk` reducer: top-k sparsification with error feedback, after mlbench's
// SparsifiedSGD / CentralizedSparsifiedSGD (sparsified SGD with memory:
// Stich, Cordonnier, Jaggi, "Sparsified SGD with memory", NeurIPS 2018).
//
// Per bucket entry t (one parameter, n_t elements) on every rank:
//   u  = momentum x u + g           (momentum > 0: DGC momentum correction,
//                                    MomentumCorrection; else u = g)
//   p  = u + e                      (e = 0 without error feedback)
//   k  = min(n_t, max(min_k, ceil(ratio x n_t)))  (keep_count)
//   S  = the k indices of largest |p_i| (ties: lower index first)
//   e  = p with S set to 0          (error_feedback: true): exactly what was
//        not sent is added to the next step's gradient
//   u  = u with S set to 0          (momentum_masking, DGC)
// One allgather moves every rank's (index, value) pairs, 8 bytes each
// (uint32 index into the bucket's flat buffer, float32 value); each rank
// scatter-adds all of them in rank order into a zeroed buffer and divides by
// W, so every rank ends with the same (1/W) sum_r sparse(p_r). With ratio 1
// this is the exact mean.
//
// bytes_sent per bucket: (W-1) x 8 x sum_t k_t.
// Options: ratio (double in (0, 1], default 0.01), min_k (int >= 1, default
// 256), error_feedback (bool, default true), momentum (double in [0, 1),
// default 0; > 0 needs optimizer.momentum 0, the host checks),
// momentum_masking (bool, default true). Why min_k and momentum: the
// study (BENCHMARKS.md "Compression robustness"): at ratio 0.01 with the optimizer's momentum
// the mlp reached 75-83% depending on seed and BLAS kernels; starved small
// tensors and momentum applied after sparsification were the causes, and
// with both remedies it reaches 85.5-86% (dense: 86%). The residual and
// velocity are float32, one per parameter element, kept in this reducer;
// checkpoints hold them (save_state). Bucket dtypes: float32, float64,
// float16, bfloat16 (computed in float32). Thread safety: as every reducer.
// kernels (auto | cpu | generic; compress_common.hpp): the generic path
// selects the same k indices (the k-th largest |p| by at::topk, then ties in
// index order by a cumulative count), sends the same pairs and sums them in
// rank order (one index_add_ per rank: a rank's indices are distinct, so no
// atomics race), so it is bit-identical to the CPU kernels. Its check that
// peers' indices lie in the bucket reads one int64 to the host per bucket.
#pragma once

#include <cstdint>
#include <vector>

#include "compress_common.hpp"

namespace distopt::plugins::compress {

class TopkReducer : public CompressReducer {
 public:
  TopkReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
              size_t num_buckets);
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override;
  /// Checkpoints: with error_feedback, each parameter's residual as the
  /// RANK_LOCAL float32 entry "error_feedback/<param name>"; without,
  /// nothing; with momentum > 0, each parameter's velocity as
  /// "momentum_correction/<param name>" (kVelocityPrefix). load_state
  /// follows CompressReducer::load_rank_local. Between steps only.
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;

 private:
  void finish(size_t b, DLTensor* flat);
  std::unique_ptr<sdk::Request> reduce_generic(size_t b, const dopt_bucket& bucket);
  void finish_generic(size_t b, const DLTensor* flat);
  std::vector<at::Tensor> residuals();

  struct Pair {
    uint32_t index;
    float value;
  };
  struct State {
    std::vector<float> work, scratch;
    at::Tensor residual;  // float32, the bucket's device (error feedback only)
    std::vector<Pair> send, recv;
    int64_t send_shape = 0, recv_shape = 0;
    size_t step = 0;
    size_t k = 0;  // pairs per rank and bucket
    DLTensor send_dl{}, recv_dl{};
    sdk::DLView send_view, recv_view;  // generic path: the pairs as uint8 device tensors
  };
  SparseOptions opts_;
  bool error_feedback_;
  MomentumCorrection momentum_;
  std::vector<State> state_;
};

}  // namespace distopt::plugins::compress
