// Buffer synchronisation (see buffer_sync.hpp).
#include "optim/buffer_sync.hpp"

#include <ATen/core/grad_mode.h>

#include <cstring>

#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/sdk/tensor.hpp"

namespace distopt::optim {

BufferSynchronizer::BufferSynchronizer(
    const std::vector<std::pair<std::string, at::Tensor>>& buffers, BufferSync mode,
    dopt_comm_ref comm, int rank, int world_size)
    : mode_(mode), comm_(comm), rank_(rank), world_size_(world_size) {
  int64_t bytes = 0, elems = 0;
  for (const auto& nb : buffers) {
    const at::Tensor& t = nb.second;
    if (!t.defined() || t.numel() == 0) continue;
    if (!t.device().is_cpu())
      throw ConfigError("buffer '" + nb.first + "' is on " + t.device().str() +
                        ": buffer synchronisation supports host buffers only");
    buffers_.push_back(t);
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
    elems += t.numel();
  }
  if (mode_ == BufferSync::broadcast) flat_ = at::empty({bytes}, at::kByte);
  if (mode_ == BufferSync::average) flat_ = at::empty({elems}, at::kDouble);
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

void BufferSynchronizer::broadcast_bytes() {
  auto* p = static_cast<char*>(flat_.data_ptr());
  if (rank_ == 0)
    for (const at::Tensor& t : buffers_) {
      const at::Tensor c = t.contiguous();
      const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
      std::memcpy(p, c.data_ptr(), n);
      p += n;
    }
  sdk::DLView v(flat_);
  dopt_request* req = nullptr;
  const std::string what =
      "broadcast(buffers from rank 0, " + std::to_string(flat_.numel()) + " bytes)";
  dopt_status st = comm_.vt->broadcast(comm_.comm, v.get(), 0, &req);
  if (st != DOPT_OK) throw CommError(st, "communicator", what, take_last_error());
  CommRequest(comm_.vt, req, "communicator:" + what).wait();
  if (rank_ == 0) return;
  p = static_cast<char*>(flat_.data_ptr());
  for (at::Tensor& t : buffers_) {
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    if (t.is_contiguous()) {
      std::memcpy(t.data_ptr(), p, n);
    } else {
      at::Tensor c = at::empty(t.sizes(), t.options());
      std::memcpy(c.data_ptr(), p, n);
      t.copy_(c);
    }
    p += n;
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
