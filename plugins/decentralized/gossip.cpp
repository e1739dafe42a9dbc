#include "gossip.hpp"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace distopt::plugins::decentralized {
namespace {
constexpr int32_t kClearToSend = 1 << 30;  // added to a bucket's tag
constexpr int32_t kDelivered = 1 << 29;
}  // namespace

BucketGossip::BucketGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params)
    : params_(bucket, params, "decentralized") {}

uint64_t BucketGossip::start(sdk::CommView& comm, const MixingRow& row, int32_t tag, bool notices) {
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
  order_.clear();
  if (row.average_all) {
    pending_.push_back(comm.allreduce(s, s, DOPT_REDUCE_SUM));
    return sdk::ring_allreduce_bytes(bytes, world_size_);
  }
  comm_ = &comm;
  tag_ = tag;
  notices_ = notices;
  const size_t links = row.links.size();
  recv_.resize(links);
  if (!cts_out_.defined()) cts_out_ = at::zeros({1}, at::kFloat);
  if (!cts_in_.defined() || cts_in_.numel() != static_cast<int64_t>(2 * links))
    cts_in_ = at::zeros({static_cast<int64_t>(2 * links)}, at::kFloat);
  cts_wire_.clear();
  cts_wire_.reserve(1 + 2 * links);
  cts_wire_.emplace_back(cts_out_);
  for (size_t i = 0; i < links; ++i) {
    if (!recv_[i].defined()) recv_[i] = at::empty_like(send);
    wire_.emplace_back(recv_[i]);
    cts_wire_.emplace_back(cts_in_.narrow(0, static_cast<int64_t>(2 * i), 1));
    cts_wire_.emplace_back(cts_in_.narrow(0, static_cast<int64_t>(2 * i + 1), 1));
  }
  // Receives first, so a neighbour's bucket never waits for a buffer.
  for (size_t i = 0; i < links; ++i) {
    const int32_t peer = row.links[i].peer;
    in_.push_back(comm.recv(*wire_[1 + i].get(), peer, tag));
    clear_.push_back(comm.recv(*cts_wire_[1 + 2 * i].get(), peer, tag + kClearToSend));
    if (notices) acked_.push_back(comm.recv(*cts_wire_[2 + 2 * i].get(), peer, tag + kDelivered));
    order_.push_back(i);
  }
  got_.assign(links, 0);
  sent_.assign(links, 0);
  const int32_t rank = comm.rank();
  const auto offset = [&](size_t i) {
    return (row.links[i].peer - rank + world_size_) % world_size_;
  };
  std::sort(order_.begin(), order_.end(),
            [&](size_t a, size_t b) { return offset(a) < offset(b); });
  return bytes * links;
}

void BucketGossip::clear_to_send(size_t link) {
  pending_.push_back(comm_->send(*cts_wire_[0].get(), row_.links[link].peer, tag_ + kClearToSend));
}

bool BucketGossip::received(size_t link) {
  if (got_[link]) return true;
  if (!in_[link].test()) return false;
  got_[link] = 1;
  if (notices_)
    pending_.push_back(comm_->send(*cts_wire_[0].get(), row_.links[link].peer, tag_ + kDelivered));
  return true;
}

bool BucketGossip::cleared(size_t link, bool block) {
  if (sent_[link]) return false;
  if (block) clear_[link].wait();
  return block || clear_[link].test();
}

void BucketGossip::send(size_t link) {
  at::NoGradGuard ng;
  sent_[link] = 1;
  pending_.push_back(comm_->send(*wire_[0].get(), row_.links[link].peer, tag_));
}

bool BucketGossip::delivered(size_t link) { return !notices_ || acked_[link].test(); }

void BucketGossip::finish() {
  at::NoGradGuard ng;
  try {
    // Every send is posted (RoundSchedule::run): the buckets come, then
    // this rank's delivered notices go out before it waits for the peers'.
    for (auto& h : in_) h.wait();
    for (size_t i = 0; i < in_.size(); ++i) received(i);
    for (auto* hs : {&clear_, &acked_, &pending_})
      for (auto& h : *hs) h.wait();
  } catch (...) {
    abandon();
    throw;
  }
  abandon();  // the exchange is over: drop the handles
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
  in_.clear();
  clear_.clear();
  acked_.clear();
  started_ = false;
}

void RoundSchedule::add(BucketGossip& g) {
  buckets_.push_back(&g);
  for (size_t link : g.grant_order()) grants_.push_back({&g, link});
  unsent_ += g.links();
  advance();
}

bool RoundSchedule::advance() {
  bool moved = false;
  while (granted_ < grants_.size() &&
         (granted_ == 0 || !one_at_a_time_ ||
          grants_[granted_ - 1].g->received(grants_[granted_ - 1].link))) {
    grants_[granted_].g->clear_to_send(grants_[granted_].link);
    ++granted_;
    moved = true;
  }
  // The last granted bucket's arrival sends its delivered notice, which its
  // sender may wait for before its next send.
  if (granted_ > 0) grants_[granted_ - 1].g->received(grants_[granted_ - 1].link);
  if (unsent_ == 0) return moved;
  if (one_at_a_time_ && in_flight_.g && !in_flight_.g->delivered(in_flight_.link)) return moved;
  for (BucketGossip* g : buckets_)
    for (size_t link = 0; link < g->links(); ++link)
      if (g->cleared(link)) {
        g->send(link);
        in_flight_ = {g, link};
        --unsent_;
        moved = true;
        if (one_at_a_time_) return true;
      }
  return moved;
}

bool RoundSchedule::done() const { return granted_ == grants_.size() && unsent_ == 0; }

void RoundSchedule::run() {
  advance();
  if (!one_at_a_time_)  // every clear-to-send is out: block on the neighbours' in turn
    for (BucketGossip* g : buckets_)
      for (size_t link = 0; link < g->links(); ++link)
        if (g->cleared(link, true)) {
          g->send(link);
          --unsent_;
        }
  while (!done())
    if (!advance() && !done()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  for (BucketGossip* g : buckets_) g->finish();
  clear();
}

void RoundSchedule::clear() {
  buckets_.clear();
  grants_.clear();
  granted_ = 0;
  unsent_ = 0;
  in_flight_ = {nullptr, 0};
}

}  // namespace distopt::plugins::decentralized
