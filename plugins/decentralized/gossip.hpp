// One bucket's parameter exchange in a gossip round: pack this rank's
// parameters of the bucket, send them to every neighbour of the mixing row
// and receive theirs (or allreduce them for `complete`), then write
// self_weight * x + sum(w_j * x_j) back into the parameters.
//
// The exchange is receiver-driven (the rendezvous protocol of MPI
// libraries for large messages): start() posts the receives, and a bucket
// goes out to a neighbour only once that neighbour's 4-byte clear-to-send
// for the same round arrived (send_cleared()). Sent eagerly, a rank's
// next-round bucket would reach a neighbour that is still receiving this
// round from another peer and halve that neighbour's download rate; the
// delay then propagates, and with shift_one on 4 ranks over 100 Mbit/s
// links each round took about twice its link time.
//
// Each link direction carries one bucket at a time (RoundSchedule): a rank
// sends the clear-to-send of its next (bucket, link) only once the previous
// one's bucket has arrived, links in order of their offset (peer - rank)
// mod n, and posts its next send only once the neighbour that got its
// previous one said it arrived (a 4-byte delivered notice: a send
// completes when its bytes are in the socket, long before they are
// received). On a ring every rank then sends to its left neighbour while
// receiving from its right one, then the other way, instead of two flows
// sharing each direction. Plain TCP sockets between 4 hosts with 100 Mbit/s
// links exchanging 2.14 MB with both ring neighbours: 410-418 ms both at
// once, 367 ms one at a time (the link floor is 343 ms; BENCHMARKS.md).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/bucket_params.hpp"
#include "distopt/sdk/sdk.hpp"
#include "topology.hpp"

namespace distopt::plugins::decentralized {

class BucketGossip {
 public:
  /// `params`: the algorithm's parameter tensors (index = dopt_param index,
  /// undefined for frozen ones); the bucket's entries name which it holds.
  BucketGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params);

  /// Pack the parameters and post the receives (the bucket's and the
  /// neighbours' clear-to-sends); clear_to_send() then lets each neighbour
  /// send. `tag` (0 <= tag < 2^29) identifies the bucket on the wire,
  /// tag + 2^30 its clear-to-send, tag + 2^29 its delivered notice. `comm` must outlive the
  /// exchange. notices: exchange delivered notices (RoundSchedule one_at_a_time; every rank must
  /// say the same). Returns the bytes this rank sends (the 4-byte clear-to-sends and notices left
  /// out).
  uint64_t start(sdk::CommView& comm, const MixingRow& row, int32_t tag, bool notices);
  bool started() const { return started_; }
  /// Links of the started exchange (0 for complete, whose allreduce needs
  /// no clear-to-send), in the order clear_to_send should take them:
  /// ascending offset (peer - rank) mod world size.
  const std::vector<size_t>& grant_order() const { return order_; }
  /// Send link `i`'s neighbour the clear-to-send for this bucket.
  void clear_to_send(size_t link);
  /// Non-blocking: whether link `i`'s bucket has arrived (the first true
  /// sends that neighbour the delivered notice, with notices).
  bool received(size_t link);
  /// Whether link `i`'s neighbour sent its clear-to-send and the bucket is
  /// not sent to it yet; block: wait for the clear-to-send.
  bool cleared(size_t link, bool block = false);
  /// Post the bucket's send to link `i`'s neighbour (once cleared()).
  void send(size_t link);
  /// Non-blocking: whether link `i`'s neighbour said the bucket arrived
  /// (true without notices).
  bool delivered(size_t link);
  size_t links() const { return clear_.size(); }
  /// All of these throw the communicator's error (naming the peer) on failure.
  /// Wait for the exchange and mix into the parameters. Every clear-to-send
  /// must have been sent and every send posted (RoundSchedule::run). Throws the
  /// communicator's error (naming the peer) on failure.
  void finish();
  /// Drop a started exchange (after a failure elsewhere).
  void abandon();

 private:
  sdk::BucketParams params_;  // packed into its buffer(), which is what is sent
  std::vector<at::Tensor> recv_;
  std::vector<sdk::DLView> wire_;         // DLTensors of the pending operations
  std::vector<sdk::CommHandle> pending_;  // sends (buckets and notices), the allreduce
  std::vector<sdk::CommHandle> in_;       // the neighbours' buckets, by link
  std::vector<sdk::CommHandle> clear_;    // the neighbours' clear-to-sends, by link
  std::vector<sdk::CommHandle> acked_;    // the neighbours' delivered notices, by link
  std::vector<char> got_, sent_;          // by link: bucket received / sent
  std::vector<size_t> order_;             // grant_order()
  at::Tensor cts_out_, cts_in_;           // float32: [1] sent, [2 * links] received
  std::vector<sdk::DLView> cts_wire_;     // DLTensors of the clear-to-send operations
  sdk::CommView* comm_ = nullptr;
  int32_t tag_ = 0;
  MixingRow row_;
  int32_t world_size_ = 1;
  bool started_ = false;
  bool notices_ = false;
};

/// One gossip round's schedule over its started buckets: a rank grants one
/// (bucket, link) at a time (buckets in the order they started, each
/// bucket's links in its grant_order()), the next once the previous one's
/// bucket arrived, and has one send in flight at a time, the next posted
/// once the previous one is delivered. Deadlock-free: every step a rank
/// waits for depends only on bytes already on the wire or on clear-to-sends,
/// which every rank keeps granting as its receives complete. Not
/// thread-safe (the algorithm's threads take turns: on_bucket_ready during
/// backward, step() after it).
class RoundSchedule {
 public:
  /// one_at_a_time false: grant every clear-to-send at once and post every
  /// cleared send, without delivered notices (ranks on one host share no
  /// link; the chain would only add its round trips: 5% fewer samples/s,
  /// 4 ranks on one host). Every rank must choose the same.
  void set_one_at_a_time(bool on) { one_at_a_time_ = on; }
  bool one_at_a_time() const { return one_at_a_time_; }
  /// Add a started bucket and move what can move.
  void add(BucketGossip& g);
  /// Non-blocking: grant the clear-to-sends whose predecessors arrived and
  /// post the next send if the last one was delivered; true when it moved.
  bool advance();
  /// Drive advance() until every clear-to-send is granted and every send
  /// posted (sleeping 20 us between looks that moved nothing: a link event
  /// takes far longer, and polling must leave the cores to the
  /// communicator's threads), then finish every bucket in start order.
  void run();
  /// Forget the round (after run or a failure).
  void clear();

 private:
  struct Entry {
    BucketGossip* g;
    size_t link;
  };
  bool done() const;
  std::vector<BucketGossip*> buckets_;  // started, in start order
  std::vector<Entry> grants_;           // every (bucket, link) in grant order
  size_t granted_ = 0;                  // grants_[0, granted_) have their clear-to-send
  size_t unsent_ = 0;                   // sends not posted yet
  Entry in_flight_{nullptr, 0};         // the last send, until delivered
  bool one_at_a_time_ = true;
};

}  // namespace distopt::plugins::decentralized
