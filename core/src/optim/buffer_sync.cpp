// Buffer synchronisation (see buffer_sync.hpp).
#include "optim/buffer_sync.hpp"

#include <ATen/core/grad_mode.h>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::optim {

BufferSynchronizer::BufferSynchronizer(
    const std::vector<std::pair<std::string, at::Tensor>>& buffers, BufferSync mode,
    const OptimizerBuild& build, int rank, int world_size)
    : mode_(mode), rank_(rank), world_size_(world_size) {
  int64_t bytes = 0, elems = 0;
  std::string first;
  at::Device device(at::kCPU);
  for (const auto& nb : buffers) {
    const at::Tensor& t = nb.second;
    if (!t.defined() || t.numel() == 0) continue;
    if (first.empty()) {
      first = nb.first;
      device = t.device();
    } else if (t.device() != device) {
      throw ConfigError("buffer '" + nb.first + "' is on " + t.device().str() + " and buffer '" +
                        first + "' on " + device.str() +
                        ": buffer synchronisation needs every buffer on one device");
    }
    buffers_.push_back(t);
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
    elems += t.numel();
  }
  const auto opts = at::TensorOptions().device(device);
  if (mode_ == BufferSync::broadcast) flat_ = at::empty({bytes}, opts.dtype(at::kByte));
  if (mode_ == BufferSync::average) flat_ = at::empty({elems}, opts.dtype(at::kDouble));
  comm_ = comm_for(
      build, sdk::DLView(flat_.defined() ? flat_ : at::empty({0}, opts)).get()->device.device_type);
}

void BufferSynchronizer::rebind(const OptimizerBuild& build, int rank, int world_size) {
  rank_ = rank;
  world_size_ = world_size;
  const at::Device device = buffers_.empty() ? at::Device(at::kCPU) : buffers_[0].device();
  comm_ = comm_for(
      build,
      sdk::DLView(flat_.defined() ? flat_ : at::empty({0}, at::TensorOptions().device(device)))
          .get()
          ->device.device_type);
}

uint64_t BufferSynchronizer::payload_bytes() const {
  if (mode_ == BufferSync::none || world_size_ <= 1 || buffers_.empty()) return 0;
  return static_cast<uint64_t>(flat_.numel()) * flat_.element_size();
}

void BufferSynchronizer::sync() {
  if (payload_bytes() == 0) return;
  at::NoGradGuard no_grad;
  if (mode_ == BufferSync::broadcast)
    broadcast_bytes();
  else
    average();
}

namespace {
// The bytes of `t` as a flat uint8 tensor on its device (a copy when t is
// not contiguous).
at::Tensor bytes_of(const at::Tensor& t) { return t.contiguous().view({-1}).view(at::kByte); }
}  // namespace

void BufferSynchronizer::broadcast_bytes() {
  // Tensor copies, not memcpy: the buffers may be device memory.
  int64_t off = 0;
  if (rank_ == 0)
    for (const at::Tensor& t : buffers_) {
      const at::Tensor b = bytes_of(t);
      flat_.narrow(0, off, b.numel()).copy_(b);
      off += b.numel();
    }
  sdk::DLView v(flat_);
  dopt_request* req = nullptr;
  const std::string what =
      "broadcast(buffers from rank 0, " + std::to_string(flat_.numel()) + " bytes)";
  dopt_status st = comm_.vt->broadcast(comm_.comm, v.get(), 0, &req);
  if (st != DOPT_OK) throw CommError(st, "communicator", what, take_last_error());
  CommRequest(comm_.vt, req, "communicator:" + what).wait();
  if (rank_ == 0) return;
  off = 0;
  for (at::Tensor& t : buffers_) {
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    // Into the destination's own byte view (an offset into flat_ need not be
    // aligned for t's dtype).
    at::Tensor dst = t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
    dst.view({-1}).view(at::kByte).copy_(flat_.narrow(0, off, n));
    if (!t.is_contiguous()) t.copy_(dst);
    off += n;
  }
}

void BufferSynchronizer::average() {
  const double inv = 1.0 / world_size_;
  int64_t off = 0;
  for (const at::Tensor& t : buffers_) {
    at::Tensor slot = flat_.narrow(0, off, t.numel());
    if (at::isFloatingType(t.scalar_type())) {
      slot.copy_(t.reshape({-1})).mul_(inv);
    } else if (rank_ == 0) {
      slot.copy_(t.reshape({-1}));
    } else {
      slot.zero_();
    }
    off += t.numel();
  }
  sdk::DLView v(flat_);
  dopt_request* req = nullptr;
  const std::string what =
      "allreduce(buffers averaged, " + std::to_string(flat_.numel()) + " float64, SUM)";
  dopt_status st = comm_.vt->allreduce(comm_.comm, v.get(), v.get(), DOPT_REDUCE_SUM, &req);
  if (st != DOPT_OK) throw CommError(st, "communicator", what, take_last_error());
  CommRequest(comm_.vt, req, "communicator:" + what).wait();
  off = 0;
  for (at::Tensor& t : buffers_) {
    t.copy_(flat_.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

}  // namespace distopt::optim
