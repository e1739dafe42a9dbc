#include "gossip.hpp"

#include <string>

namespace distopt::plugins::decentralized {

BucketGossip::BucketGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params)
    : bucket_(&bucket) {
  const at::Tensor flat = sdk::as_tensor(*bucket.flat);
  send_ = at::zeros_like(flat);
  for (size_t e = 0; e < bucket.num_entries; ++e) {
    const dopt_bucket_entry& en = bucket.entries[e];
    if (en.param_index < 0 || static_cast<size_t>(en.param_index) >= params.size() ||
        !params[en.param_index].defined())
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string("decentralized: bucket entry ") +
                                                      (en.name ? en.name : "?") +
                                                      " names no trainable parameter");
    views_.push_back(params[en.param_index].view({-1}));
  }
}

uint64_t BucketGossip::start(sdk::CommView& comm, const MixingRow& row, int32_t tag) {
  at::NoGradGuard ng;
  row_ = row;
  world_size_ = comm.world_size();
  for (size_t e = 0; e < views_.size(); ++e)
    send_
        .narrow(0, static_cast<int64_t>(bucket_->entries[e].offset),
                static_cast<int64_t>(bucket_->entries[e].numel))
        .copy_(views_[e]);
  started_ = true;
  const uint64_t bytes = static_cast<uint64_t>(send_.numel()) * send_.element_size();
  wire_.clear();
  wire_.reserve(1 + row.links.size());
  wire_.emplace_back(send_);
  DLTensor& s = *wire_[0].get();
  if (row.average_all) {
    pending_.push_back(comm.allreduce(s, s, DOPT_REDUCE_SUM));
    return sdk::ring_allreduce_bytes(bytes, world_size_);
  }
  recv_.resize(row.links.size());
  for (size_t i = 0; i < row.links.size(); ++i) {
    if (!recv_[i].defined()) recv_[i] = at::empty_like(send_);
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
    scatter(send_.div_(world_size_));
    return;
  }
  at::Tensor mixed = send_.mul(row_.self_weight);
  for (size_t i = 0; i < row_.links.size(); ++i) mixed.add_(recv_[i], row_.links[i].weight);
  scatter(mixed);
}

void BucketGossip::abandon() {
  pending_.clear();
  started_ = false;
}

void BucketGossip::scatter(const at::Tensor& mixed) {
  for (size_t e = 0; e < views_.size(); ++e)
    views_[e].copy_(mixed.narrow(0, static_cast<int64_t>(bucket_->entries[e].offset),
                                 static_cast<int64_t>(bucket_->entries[e].numel)));
}

}  // namespace distopt::plugins::decentralized
