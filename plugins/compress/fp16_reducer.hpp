// `fp16` and `bf16` reducers: PyTorch DDP's fp16_compress_hook (and its
// bf16_compress_hook), as a distopt reducer.
//
// Per bucket: every element is divided by the world size W in float32, cast
// to IEEE half (fp16) or bfloat16 (round to nearest even), the half-size
// buffer is summed over ranks with one in-place allreduce (DOPT_REDUCE_SUM,
// the communicator's 16-bit kernels), and the result is cast back into the
// bucket. Dividing before the sum (as DDP does) keeps the fp16 sum from
// overflowing at 65504 when a gradient is large. Padding travels too (it is
// part of the flat buffer), exactly as the `mean` reducer sends it.
//
// Precision: each element is the mean over ranks up to W 16-bit roundings
// (one cast per rank, W-1 partial sums in the communicator's 16-bit kernel;
// relative 2^-11 each for fp16, 2^-8 for bf16, of sum_r |g_r| / W) plus
// fp16's subnormal floor (|x|/W below 6e-8 flushes toward 0; bf16 has
// float32's range).
//
// bytes_sent: a ring allreduce of the 16-bit buffer, 2 (W-1)/W x 2 x length
// bytes per bucket: half of what `mean` sends for a float32 bucket.
// Options: kernels (auto | cpu | generic; compress_common.hpp; bf16's auto
// takes the generic path on the host too: faster there). The generic
// path computes the same bits as the CPU kernels (x / W in float32, one RNE
// cast to 16 bits, a 16-bit SUM allreduce of a device tensor, a cast back).
// Bucket dtypes: float32, float64, float16, bfloat16 (host or CUDA).
// Thread safety: reduce() for one bucket at a time per bucket (the host's
// order); requests may be tested/waited from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "compress_common.hpp"

namespace distopt::plugins::compress {

/// Cast-allreduce-cast reducer; `Bf16` picks bfloat16, else IEEE half.
template <bool Bf16>
class HalfCastReducer : public CompressReducer {
 public:
  HalfCastReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
                  size_t num_buckets);
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override;
  /// Checkpoints: nothing to keep (each step is a pure function of the
  /// bucket), so nothing is put or read.
  void save_state(sdk::StateWriter&) override {}
  void load_state(const sdk::StateReader&) override {}

 private:
  struct State {
    std::vector<float> work;
    std::vector<uint16_t> wire;  // the 16-bit buffer that is allreduced in place
    int64_t shape = 0;
    DLTensor dl{};
    sdk::DLView wire_view;  // generic path: the 16-bit device tensor in flight
  };
  std::unique_ptr<sdk::Request> reduce_generic(const dopt_bucket& bucket, const BucketLayout& l,
                                               State& s);
  std::vector<State> state_;  // per bucket
};

using Fp16Reducer = HalfCastReducer<false>;
using Bf16Reducer = HalfCastReducer<true>;

extern template class HalfCastReducer<false>;
extern template class HalfCastReducer<true>;

}  // namespace distopt::plugins::compress
