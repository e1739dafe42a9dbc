#include "gossip.hpp"

#include <ATen/core/grad_mode.h>

namespace distopt::plugins::decentralized {

BucketGossip::BucketGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params)
    : params_(bucket, params, "decentralized") {}

uint64_t BucketGossip::start(sdk::CommView& comm, const MixingRow& row, int32_t tag,
                             RoundSchedule& round) {
  at::NoGradGuard ng;
  row_ = row;
  world_size_ = comm.world_size();
  at::Tensor& send = params_.pack();
  started_ = true;
  const uint64_t bytes = params_.nbytes();
  if (row.average_all) {
    wire_.clear();
    wire_.emplace_back(send);
    DLTensor& s = *wire_[0].get();
    allreduce_ = comm.allreduce(s, s, DOPT_REDUCE_SUM);
    return sdk::ring_allreduce_bytes(bytes, world_size_);
  }
  std::vector<int32_t> peers;
  recv_.resize(row.links.size());
  for (size_t i = 0; i < row.links.size(); ++i) {
    peers.push_back(row.links[i].peer);
    if (!recv_[i].defined()) recv_[i] = at::empty_like(send);
  }
  links_.start(comm, peers, send, recv_, tag, round.one_at_a_time());
  round.add(links_);
  return bytes * row.links.size();
}

void BucketGossip::finish() {
  at::NoGradGuard ng;
  try {
    allreduce_.wait();
    links_.wait();
  } catch (...) {
    abandon();
    throw;
  }
  abandon();  // over: drop the handles
  if (row_.average_all) {
    params_.unpack(params_.buffer().div_(world_size_));
    return;
  }
  at::Tensor mixed = params_.buffer().mul(row_.self_weight);
  for (size_t i = 0; i < row_.links.size(); ++i) mixed.add_(recv_[i], row_.links[i].weight);
  params_.unpack(mixed);
}

void BucketGossip::abandon() {
  allreduce_.reset();
  links_.abandon();
  started_ = false;
}

}  // namespace distopt::plugins::decentralized
