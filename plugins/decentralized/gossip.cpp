#include "gossip.hpp"

#include <ATen/core/grad_mode.h>

#include <string>

namespace distopt::plugins::decentralized {

BucketGossip::BucketGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params)
    : params_(bucket, params, "decentralized") {}

uint64_t BucketGossip::start(sdk::CommView& comm, const MixingRow& row, int32_t tag) {
  at::NoGradGuard ng;
  row_ = row;
  world_size_ = comm.world_size();
  at::Tensor& send = params_.pack();
  started_ = true;
  const uint64_t bytes = params_.nbytes();
  wire_.clear();
  wire_.reserve(1 + row.links.size());
  wire_.emplace_back(send);
  DLTensor& s = *wire_[0].get();
  if (row.average_all) {
    pending_.push_back(comm.allreduce(s, s, DOPT_REDUCE_SUM));
    return sdk::ring_allreduce_bytes(bytes, world_size_);
  }
  recv_.resize(row.links.size());
  for (size_t i = 0; i < row.links.size(); ++i) {
    if (!recv_[i].defined()) recv_[i] = at::empty_like(send);
    wire_.emplace_back(recv_[i]);
    pending_.push_back(comm.send(s, row.links[i].peer, tag));
    pending_.push_back(comm.recv(*wire_.back().get(), row.links[i].peer, tag));
  }
  return bytes * row.links.size();
}

void BucketGossip::finish() {
  at::NoGradGuard ng;
  try {
    for (auto& h : pending_) h.wait();
  } catch (...) {
    abandon();
    throw;
  }
  pending_.clear();
  started_ = false;
  if (row_.average_all) {
    params_.unpack(params_.buffer().div_(world_size_));
    return;
  }
  at::Tensor mixed = params_.buffer().mul(row_.self_weight);
  for (size_t i = 0; i < row_.links.size(); ++i) mixed.add_(recv_[i], row_.links[i].weight);
  params_.unpack(mixed);
}

void BucketGossip::abandon() {
  pending_.clear();
  started_ = false;
}

}  // namespace distopt::plugins::decentralized
