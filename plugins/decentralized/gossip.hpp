// One bucket's parameter exchange in a gossip round: pack this rank's
// parameters of the bucket, send them to every neighbour of the mixing row
// and receive theirs (or allreduce them for `complete`), then write
// self_weight * x + sum(w_j * x_j) back into the parameters.
//
// The exchange is receiver-driven (the rendezvous protocol of MPI
// libraries for large messages): start() posts the receives and sends each
// neighbour a 4-byte clear-to-send; a bucket goes out to a neighbour only
// once that neighbour's clear-to-send for the same round arrived
// (send_cleared()). Sent eagerly, a rank's next-round bucket would reach a
// neighbour that is still receiving this round from another peer and halve
// that neighbour's download rate; the delay then propagates, and with
// shift_one on 4 ranks over 100 Mbit/s links each round took about twice
// its link time (tools/bench/compare_decentralized.py, BENCHMARKS.md).
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

  /// Pack the parameters, post the receives and send every neighbour its
  /// clear-to-send; `tag` (0 <= tag < 2^30) identifies the bucket on the
  /// wire, tag + 2^30 its clear-to-send. `comm` must outlive the exchange.
  /// Returns the bytes this rank sends (the 4-byte clear-to-sends left out).
  uint64_t start(sdk::CommView& comm, const MixingRow& row, int32_t tag);
  bool started() const { return started_; }
  /// Post the bucket's send to every neighbour whose clear-to-send arrived:
  /// block = true waits for all of them (once per round; finish() calls it
  /// if needed; call it for every bucket before finishing any, so that the
  /// buckets' sends overlap), block = false posts only those already here
  /// (during backward, so a bucket moves while later ones are computed).
  /// Throws the communicator's error (naming the peer) on failure.
  void send_cleared(bool block = true);
  /// Wait for the exchange and mix into the parameters. Throws the
  /// communicator's error (naming the peer) on failure.
  void finish();
  /// Drop a started exchange (after a failure elsewhere).
  void abandon();

 private:
  sdk::BucketParams params_;  // packed into its buffer(), which is what is sent
  std::vector<at::Tensor> recv_;
  std::vector<sdk::DLView> wire_;  // DLTensors of the pending operations
  std::vector<sdk::CommHandle> pending_;
  std::vector<sdk::CommHandle> clear_;  // the neighbours' clear-to-sends, by link
  at::Tensor cts_out_, cts_in_;         // float32: [1] sent, [links] received
  std::vector<sdk::DLView> cts_wire_;   // DLTensors of the clear-to-send operations
  sdk::CommView* comm_ = nullptr;
  int32_t tag_ = 0;
  MixingRow row_;
  int32_t world_size_ = 1;
  bool started_ = false;
};

}  // namespace distopt::plugins::decentralized
