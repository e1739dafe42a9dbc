#include "link_exchange.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace distopt::plugins::decentralized {
namespace {
constexpr int32_t kClearToSend = 1 << 30;  // added to a message's tag
constexpr int32_t kDelivered = 1 << 29;
}  // namespace

void LinkExchange::start(sdk::CommView& comm, const std::vector<int32_t>& peers,
                         const at::Tensor& send, std::vector<at::Tensor>& recv, int32_t tag,
                         bool notices) {
  comm_ = &comm;
  tag_ = tag;
  notices_ = notices;
  peers_ = peers;
  const size_t links = peers.size();
  // On the message's device: a device-only communicator (nccl) takes no
  // host memory.
  const at::TensorOptions f32 = send.options().dtype(at::kFloat);
  if (!cts_out_.defined() || cts_out_.device() != send.device()) cts_out_ = at::zeros({1}, f32);
  if (!cts_in_.defined() || cts_in_.device() != send.device() ||
      cts_in_.numel() != static_cast<int64_t>(2 * links))
    cts_in_ = at::zeros({static_cast<int64_t>(2 * links)}, f32);
  wire_.clear();
  wire_.reserve(1 + links);
  wire_.emplace_back(send);
  cts_wire_.clear();
  cts_wire_.reserve(1 + 2 * links);
  cts_wire_.emplace_back(cts_out_);
  for (size_t i = 0; i < links; ++i) {
    wire_.emplace_back(recv[i]);
    cts_wire_.emplace_back(cts_in_.narrow(0, static_cast<int64_t>(2 * i), 1));
    cts_wire_.emplace_back(cts_in_.narrow(0, static_cast<int64_t>(2 * i + 1), 1));
  }
  abandon();
  // Receives first, so a peer's message never waits for a buffer.
  for (size_t i = 0; i < links; ++i) {
    in_.push_back(comm.recv(*wire_[1 + i].get(), peers[i], tag));
    clear_.push_back(comm.recv(*cts_wire_[1 + 2 * i].get(), peers[i], tag + kClearToSend));
    if (notices)
      acked_.push_back(comm.recv(*cts_wire_[2 + 2 * i].get(), peers[i], tag + kDelivered));
  }
  got_.assign(links, 0);
  sent_.assign(links, 0);
  order_.resize(links);
  const int32_t rank = comm.rank(), n = comm.world_size();
  for (size_t i = 0; i < links; ++i) order_[i] = i;
  const auto offset = [&](size_t i) { return (peers[i] - rank + n) % n; };
  std::sort(order_.begin(), order_.end(),
            [&](size_t a, size_t b) { return offset(a) < offset(b); });
}

void LinkExchange::clear_to_send(size_t link) {
  out_.push_back(comm_->send(*cts_wire_[0].get(), peers_[link], tag_ + kClearToSend));
}

bool LinkExchange::received(size_t link) {
  if (got_[link]) return true;
  if (!in_[link].test()) return false;
  got_[link] = 1;
  if (notices_) out_.push_back(comm_->send(*cts_wire_[0].get(), peers_[link], tag_ + kDelivered));
  return true;
}

bool LinkExchange::cleared(size_t link, bool block) {
  if (sent_[link]) return false;
  if (block) clear_[link].wait();
  return block || clear_[link].test();
}

void LinkExchange::send(size_t link) {
  sent_[link] = 1;
  out_.push_back(comm_->send(*wire_[0].get(), peers_[link], tag_));
}

bool LinkExchange::delivered(size_t link) { return !notices_ || acked_[link].test(); }

void LinkExchange::wait() {
  try {
    for (auto& h : in_) h.wait();
    for (size_t i = 0; i < in_.size(); ++i) received(i);  // the last notices
    for (auto* hs : {&clear_, &acked_, &out_})
      for (auto& h : *hs) h.wait();
  } catch (...) {
    abandon();
    throw;
  }
  abandon();  // over: drop the handles
}

void LinkExchange::abandon() {
  in_.clear();
  clear_.clear();
  acked_.clear();
  out_.clear();
}

void RoundSchedule::add(LinkExchange& x) {
  started_.push_back(&x);
  for (size_t link : x.grant_order()) grants_.push_back({&x, link});
  unsent_ += x.links();
  advance();
}

bool RoundSchedule::advance() {
  bool moved = false;
  while (granted_ < grants_.size() &&
         (granted_ == 0 || !one_at_a_time_ ||
          grants_[granted_ - 1].x->received(grants_[granted_ - 1].link))) {
    grants_[granted_].x->clear_to_send(grants_[granted_].link);
    ++granted_;
    moved = true;
  }
  // The last granted message's arrival sends its delivered notice, which
  // its sender may wait for before its next send.
  if (granted_ > 0) grants_[granted_ - 1].x->received(grants_[granted_ - 1].link);
  if (unsent_ == 0) return moved;
  if (one_at_a_time_ && in_flight_.x && !in_flight_.x->delivered(in_flight_.link)) return moved;
  for (LinkExchange* x : started_)
    for (size_t link = 0; link < x->links(); ++link)
      if (x->cleared(link)) {
        x->send(link);
        in_flight_ = {x, link};
        --unsent_;
        moved = true;
        if (one_at_a_time_) return true;
      }
  return moved;
}

void RoundSchedule::run() {
  advance();
  if (!one_at_a_time_)  // every clear-to-send is out: block on the peers' in turn
    for (LinkExchange* x : started_)
      for (size_t link = 0; link < x->links(); ++link)
        if (x->cleared(link, true)) {
          x->send(link);
          --unsent_;
        }
  while (!done())
    if (!advance() && !done()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  clear();
}

void RoundSchedule::clear() {
  started_.clear();
  grants_.clear();
  granted_ = 0;
  unsent_ = 0;
  in_flight_ = {nullptr, 0};
}

}  // namespace distopt::plugins::decentralized
