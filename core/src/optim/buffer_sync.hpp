// Module buffers (BatchNorm running statistics, ...) made equal on every
// rank after each step, with one collective for all of them (config.hpp,
// BufferSync): a byte broadcast from rank 0, or a float64 allreduce that
// averages floating-point buffers and carries integer ones from rank 0.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distopt/buffers.hpp"
#include "distopt/communicator.h"
#include "optim/optimizer_builder.hpp"

namespace distopt::optim {

class BufferSynchronizer {
 public:
  /// `buffers`: dense tensors, all on one device (empty ones are skipped).
  /// The tensors are written in place by sync(), so they must stay the
  /// module's storage. The collective runs on that device, over
  /// comm_for(build, device) (the control communicator for host buffers
  /// beside a device-only communicator). Throws ConfigError for buffers on
  /// two devices.
  BufferSynchronizer(const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                     BufferSync mode, const OptimizerBuild& build, int rank, int world_size);

  /// Collective: every rank calls it at the same point (the end of step()).
  /// Nothing is sent for mode none, one rank, or no buffers. average: each
  /// floating-point buffer becomes the mean over ranks (computed in float64:
  /// exact to the buffer's precision and identical on every rank); integer
  /// and bool buffers take rank 0's value (exact up to 2^53). Throws
  /// CommError naming the operation (a dead peer, a timeout).
  void sync();

  /// After an elastic recovery: run over `build`'s communicators as rank
  /// `rank` of `world_size` from now on. Local.
  void rebind(const OptimizerBuild& build, int rank, int world_size);

  BufferSync mode() const { return mode_; }
  size_t num_buffers() const { return buffers_.size(); }
  /// Payload of one sync() in bytes (the broadcast's bytes, or 8 per element
  /// for average); 0 when nothing is sent.
  uint64_t payload_bytes() const;

 private:
  void broadcast_bytes();
  void average();

  std::vector<at::Tensor> buffers_;
  BufferSync mode_;
  dopt_comm_ref comm_;
  int rank_, world_size_;
  at::Tensor flat_;  // uint8 (broadcast) or float64 (average), allocated once
};

}  // namespace distopt::optim
