// One bucket's parameter exchange in a gossip round: pack this rank's
// parameters of the bucket, send them to every neighbour of the mixing row
// and receive theirs (link_exchange.hpp; or allreduce them for `complete`),
// then write self_weight * x + sum(w_j * x_j) back into the parameters.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/bucket_params.hpp"
#include "distopt/sdk/sdk.hpp"
#include "link_exchange.hpp"
#include "topology.hpp"

namespace distopt::plugins::decentralized {

class BucketGossip {
 public:
  /// `params`: the algorithm's parameter tensors (index = dopt_param index,
  /// undefined for frozen ones); the bucket's entries name which it holds.
  BucketGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params);

  /// Pack the parameters and start the exchange: an allreduce for
  /// average_all, else the neighbours' receives, added to `round` (which
  /// then sends; its one_at_a_time() must be the same on every rank). `tag`
  /// (0 <= tag < 2^29) identifies the bucket on the wire. `comm` must
  /// outlive the exchange. Returns the bytes this rank sends (the 4-byte
  /// clear-to-sends and notices left out).
  uint64_t start(sdk::CommView& comm, const MixingRow& row, int32_t tag, RoundSchedule& round);
  bool started() const { return started_; }
  /// Wait for the exchange (after round.run()) and mix into the parameters.
  /// Throws the communicator's error (naming the peer) on failure.
  void finish();
  /// Drop a started exchange (after a failure elsewhere).
  void abandon();

 private:
  sdk::BucketParams params_;  // packed into its buffer(), which is what is sent
  std::vector<at::Tensor> recv_;
  LinkExchange links_;
  sdk::CommHandle allreduce_;  // average_all
  std::vector<sdk::DLView> wire_;
  MixingRow row_;
  int32_t world_size_ = 1;
  bool started_ = false;
};

}  // namespace distopt::plugins::decentralized
