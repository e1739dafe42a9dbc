// The `mean` reducer: each bucket's flat buffer is averaged over ranks with
// one in-place DOPT_REDUCE_AVG allreduce on the host's communicator.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::mean {

class MeanReducer : public sdk::Reducer {
 public:
  /// ABI 1.4 devices: hands the bucket to the communicator unread, so any device; the
  /// communicator's own devices still apply (tcp: kDLCPU). CUDA: world size 1 on an H200.
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  /// ABI 1.2: the result is the exact mean of the bucket over ranks, with
  /// any options (they are core's bucketing options only), so an algorithm
  /// that averages the gradients itself (zero stage 2) computes the same.
  static constexpr uint32_t traits = DOPT_TRAIT_EXACT_MEAN;

  MeanReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
              size_t num_buckets);
  /// Starts the allreduce and returns at once; the request completes when it does.
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override;
  /// What a ring allreduce sends from this rank: 2 (W-1)/W x bucket bytes per
  /// reduction (0 on one rank).
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }
  /// Checkpoints: `mean` keeps no state across steps, so it puts nothing and
  /// reads nothing (any checkpoint, of any world size, loads).
  void save_state(sdk::StateWriter&) override {}
  void load_state(const sdk::StateReader&) override {}

 private:
  sdk::CommView comm_;
  int32_t world_size_;
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace distopt::plugins::mean
