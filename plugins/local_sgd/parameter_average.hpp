// Averaging of the parameters over all ranks, bucket by bucket: each
// bucket's parameters are packed (sdk::BucketParams), allreduced with SUM,
// divided by the world size and written back. All buckets' allreduces are
// started before the first is waited for.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/bucket_params.hpp"
#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::local_sgd {

class ParameterAverage {
 public:
  /// `params`: per dopt_param index the parameter (WholeParams::by_index());
  /// `buckets` borrowed for the algorithm's lifetime. Throws what
  /// sdk::BucketParams throws.
  ParameterAverage(const dopt_bucket* buckets, size_t num_buckets,
                   const std::vector<at::Tensor>& params);

  /// Collective (every rank, same step): replace every parameter by its mean
  /// over the ranks. Every rank ends with the same values bitwise (one
  /// allreduce result, divided alike). Returns the bytes this rank sent
  /// (ring allreduce of each bucket, sdk::ring_allreduce_bytes). Throws the
  /// communicator's error (naming the failed peer), the parameters not yet
  /// changed (they are written back only once every bucket arrived).
  uint64_t run(sdk::CommView& comm);

 private:
  std::vector<sdk::BucketParams> buckets_;
};

}  // namespace distopt::plugins::local_sgd
