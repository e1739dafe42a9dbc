// The optimizer an application steps: gradient buckets + reducer + algorithm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace distopt {

/// Made by Runtime::make_optimizer. Movable, not copyable. Not thread-safe:
/// call zero_grad / step from the training thread, after backward returns.
class DistributedOptimizer {
 public:
  struct Impl;
  explicit DistributedOptimizer(std::unique_ptr<Impl> impl);
  DistributedOptimizer(DistributedOptimizer&&) noexcept;
  DistributedOptimizer& operator=(DistributedOptimizer&&) noexcept;
  ~DistributedOptimizer();

  /// Zero every gradient (they are views into the buckets; never set to None).
  void zero_grad();
  /// Finish reducing the gradients of the last backward and run the
  /// algorithm's step. Collective. Throws CommError / ComponentError.
  void step();
  /// Set the learning rate of parameter group `group`.
  void set_lr(double lr, int group = 0);

  /// Bytes of optimizer state on this rank.
  uint64_t state_bytes() const;
  /// Bytes the reducer put on the wire from this rank since creation.
  uint64_t bytes_sent() const;
  /// Bytes a plain allreduce of the same buckets would have put on the wire.
  uint64_t bytes_sent_plain_allreduce() const;
  /// Number of buckets and steps taken.
  size_t num_buckets() const;
  int64_t steps() const;
  const std::string& algorithm_name() const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace distopt
