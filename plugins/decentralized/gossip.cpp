#include "gossip.hpp"

#include <ATen/core/grad_mode.h>

#include <string>

namespace distopt::plugins::decentralized {
namespace {
constexpr int32_t kClearToSend = 1 << 30;  // added to a bucket's tag
}  // namespace

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
  comm_ = &comm;
  tag_ = tag;
  const size_t links = row.links.size();
  recv_.resize(links);
  if (!cts_out_.defined()) cts_out_ = at::zeros({1}, at::kFloat);
  if (!cts_in_.defined() || cts_in_.numel() != static_cast<int64_t>(links))
    cts_in_ = at::zeros({static_cast<int64_t>(links)}, at::kFloat);
  cts_wire_.clear();
  cts_wire_.reserve(1 + links);
  cts_wire_.emplace_back(cts_out_);
  for (size_t i = 0; i < links; ++i) {
    if (!recv_[i].defined()) recv_[i] = at::empty_like(send);
    wire_.emplace_back(recv_[i]);
    cts_wire_.emplace_back(cts_in_.narrow(0, static_cast<int64_t>(i), 1));
  }
  // Receives first, so a neighbour's bucket never waits for a buffer.
  for (size_t i = 0; i < links; ++i) {
    const int32_t peer = row.links[i].peer;
    pending_.push_back(comm.recv(*wire_[1 + i].get(), peer, tag));
    clear_.push_back(comm.recv(*cts_wire_[1 + i].get(), peer, tag + kClearToSend));
    pending_.push_back(comm.send(*cts_wire_[0].get(), peer, tag + kClearToSend));
  }
  return bytes * links;
}

void BucketGossip::send_cleared(bool block) {
  at::NoGradGuard ng;
  for (size_t i = 0; i < clear_.size(); ++i) {
    if (!clear_[i].valid()) continue;  // sent already
    if (!block && !clear_[i].test()) continue;
    clear_[i].wait();
    clear_[i].reset();
    pending_.push_back(comm_->send(*wire_[0].get(), row_.links[i].peer, tag_));
  }
  if (block) clear_.clear();
}

void BucketGossip::finish() {
  at::NoGradGuard ng;
  try {
    send_cleared();
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
  clear_.clear();
  started_ = false;
}

}  // namespace distopt::plugins::decentralized
