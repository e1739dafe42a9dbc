// One message per neighbour in a gossip round, and the round's schedule over
// the links: what the float32 gossip (gossip.hpp) and the low-precision one
// (low_precision_gossip.hpp) send goes through here.
//
// The exchange is receiver-driven (the rendezvous protocol of MPI libraries
// for large messages): start() posts the receives, and a message goes out
// to a neighbour only once that neighbour's 4-byte clear-to-send for the
// same round arrived. Sent eagerly, a rank's next-round message would reach
// a neighbour that is still receiving this round from another peer and
// halve that neighbour's download rate; the delay then propagates, and with
// shift_one on 4 ranks over 100 Mbit/s links each round took about twice
// its link time.
//
// RoundSchedule one_at_a_time (ranks on several hosts): each link direction
// carries one message at a time. A rank sends the clear-to-send of its next
// (message, link) only once the previous one's message arrived, links in
// order of their offset (peer - rank) mod n, and posts its next send only
// once the neighbour that got its previous one said it arrived (a 4-byte
// delivered notice: a send completes when its bytes are in the socket, long
// before they are received). On a ring every rank then sends to its left
// neighbour while receiving from its right one, then the other way, instead
// of two flows sharing each direction. Plain TCP sockets between 4 hosts
// with 100 Mbit/s links exchanging 2.14 MB with both ring neighbours:
// 410-418 ms both at once, 367 ms one at a time (the link floor is 343 ms);
// the ring's step went from 462 to 412 ms (BENCHMARKS.md).
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::decentralized {

class LinkExchange {
 public:
  /// Post the receives of one message from every peer in `peers` into
  /// recv[i] (same bytes as `send`), and of their clear-to-sends (and, with
  /// `notices`, delivered notices; every rank must say the same). `send`
  /// and `recv` must stay alive and unchanged until wait() or abandon();
  /// `comm` must outlive the exchange. `tag` (0 <= tag < 2^29) identifies
  /// the message on the wire, tag + 2^30 its clear-to-send, tag + 2^29 its
  /// delivered notice.
  void start(sdk::CommView& comm, const std::vector<int32_t>& peers, const at::Tensor& send,
             std::vector<at::Tensor>& recv, int32_t tag, bool notices);
  size_t links() const { return peers_.size(); }
  /// Links in the order a one-at-a-time schedule grants them: ascending
  /// offset (peer - rank) mod world size.
  const std::vector<size_t>& grant_order() const { return order_; }
  /// Send link `i`'s peer the clear-to-send.
  void clear_to_send(size_t link);
  /// Non-blocking: whether link `i`'s message arrived (the first true sends
  /// that peer the delivered notice, with notices).
  bool received(size_t link);
  /// Whether link `i`'s peer sent its clear-to-send and the message is not
  /// sent to it yet; block: wait for the clear-to-send.
  bool cleared(size_t link, bool block = false);
  /// Post the message to link `i`'s peer (once cleared()).
  void send(size_t link);
  /// Non-blocking: whether link `i`'s peer said the message arrived (true
  /// without notices).
  bool delivered(size_t link);
  /// Wait for every message and notice (every clear-to-send sent and every
  /// send posted: RoundSchedule::run), this rank's delivered notices going
  /// out before it waits for the peers'. Then the exchange is over.
  void wait();
  /// Drop a started exchange (after a failure elsewhere).
  void abandon();
  // The methods above throw the communicator's error (naming the peer) on
  // failure.

 private:
  sdk::CommView* comm_ = nullptr;
  int32_t tag_ = 0;
  bool notices_ = false;
  std::vector<int32_t> peers_;
  std::vector<sdk::DLView> wire_;      // [0] the message, [1 + i] link i's
  std::vector<sdk::DLView> cts_wire_;  // [0] sent, [1 + 2i] clear-to-send, [2 + 2i] notice
  at::Tensor cts_out_, cts_in_;  // float32 on the message's device: [1] sent, [2 * links] received
  std::vector<sdk::CommHandle> in_;     // the peers' messages, by link
  std::vector<sdk::CommHandle> clear_;  // the peers' clear-to-sends, by link
  std::vector<sdk::CommHandle> acked_;  // the peers' delivered notices, by link
  std::vector<sdk::CommHandle> out_;    // sends: messages, clear-to-sends, notices
  std::vector<char> got_, sent_;        // by link: message received / sent
  std::vector<size_t> order_;           // grant_order()
};

/// One gossip round's schedule over its started exchanges. one_at_a_time:
/// a rank grants one (exchange, link) at a time (exchanges in the order
/// they started, each one's links in its grant_order()), the next once the
/// previous one's message arrived, and has one send in flight at a time,
/// the next posted once the previous one is delivered. Deadlock-free:
/// everything a rank waits for depends only on bytes already on the wire
/// or on clear-to-sends, which every rank keeps granting as its receives
/// complete. Otherwise (all at once) every clear-to-send goes out at once
/// and every cleared send is posted, without delivered notices. Not
/// thread-safe (the algorithm's threads take turns: on_bucket_ready during
/// backward, step() after it).
class RoundSchedule {
 public:
  /// Every rank must choose the same (the exchanges' `notices`). All at
  /// once suits ranks on one host, which share no link: the chain would
  /// only add its round trips (5% fewer samples/s, 4 ranks, one host).
  void set_one_at_a_time(bool on) { one_at_a_time_ = on; }
  bool one_at_a_time() const { return one_at_a_time_; }
  /// Add a started exchange and move what can move.
  void add(LinkExchange& x);
  /// Non-blocking: grant the clear-to-sends that may go and post the sends
  /// that may go; true when it moved.
  bool advance();
  /// Drive advance() until every clear-to-send is granted and every send
  /// posted (sleeping 20 us between looks that moved nothing: a link event
  /// takes far longer, and polling must leave the cores to the
  /// communicator's threads), then forget the round: the caller waits for
  /// each exchange.
  void run();
  /// Forget the round (after run or a failure).
  void clear();

 private:
  struct Entry {
    LinkExchange* x;
    size_t link;
  };
  bool done() const { return granted_ == grants_.size() && unsent_ == 0; }
  std::vector<LinkExchange*> started_;  // in start order
  std::vector<Entry> grants_;           // every (exchange, link) in grant order
  size_t granted_ = 0;                  // grants_[0, granted_) have their clear-to-send
  size_t unsent_ = 0;                   // sends not posted yet
  Entry in_flight_{nullptr, 0};         // the last send, until delivered
  bool one_at_a_time_ = true;
};

}  // namespace distopt::plugins::decentralized
