// One bucket's state and exchange in low-precision decentralized SGD (Bagua's
// LowPrecisionDecentralizedAlgorithm; DCD-PSGD, Tang et al., "Communication
// Compression for Decentralized Training", NeurIPS 2018, arXiv 1803.06443).
//
// Rank i keeps, per bucket (flat, float32), x_hat_i, the copy of its own
// parameters that its neighbours hold, and x_hat_j for every neighbour j of
// a static topology. A communication round runs after the inner optimizer's
// step (Bagua's post-optimizer-step hook), with x'_i the stepped parameters:
//     z_i   = x'_i - x_hat_i + (sum_j W_ij x_hat_j - x_hat_i)   (j over i and
//                                                               its peers)
//     q_i   = Q(z_i)            (minmax_uint8.hpp), sent to every neighbour
//     x_hat_i += D(q_i); x_hat_j += D(q_j) for every neighbour j
//     x_i   = x_hat_i
// With one step per round x'_i = x_hat_i - lr g_i, so z_i is DCD-PSGD's
// x_{t+1/2} - x_t and this is Bagua's rule (its ring: W_ij = 1/3, z = x' +
// (x_left + x_right) / 3 - 5/3 x_hat_i); with local steps between rounds
// (communication_interval) z_i also carries their progress. Every holder of a
// copy applies the same decoded bytes D(q_j), the sender too, so rank i's
// x_hat_j is bitwise rank j's own x_hat_j.
//
// The copies start from one float32 round (sync): x_hat_i = x_i, sent whole
// to the neighbours; it runs at the first communication round and after a
// reset (a checkpoint without matching copies).
//
// Devices: every buffer (copies, work buffers, messages) lives on the
// bucket's device and every step is a libtorch op there, the codec included
// (minmax_uint8_torch.hpp; the host codec minmax_uint8.hpp over raw pointers
// for CPU buckets unless told otherwise): no host round trip. Both codecs
// write and read the same bytes, so ranks may even mix them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/bucket_params.hpp"
#include "distopt/sdk/sdk.hpp"
#include "link_exchange.hpp"
#include "topology.hpp"

namespace distopt::plugins::decentralized {

class LowPrecisionGossip {
 public:
  /// `params`: the algorithm's parameter tensors (index = dopt_param index,
  /// undefined for frozen ones); `row`: this rank's row of the static mixing
  /// matrix (not average_all); `torch_codec`: encode and decode with
  /// libtorch ops (required off the CPU; the host codec otherwise). Throws
  /// sdk::Error(INVALID_ARGUMENT) for an entry naming no trainable
  /// parameter, (UNSUPPORTED) for a bucket that is not float32, or a non-CPU
  /// bucket without torch_codec.
  LowPrecisionGossip(const dopt_bucket& bucket, const std::vector<at::Tensor>& params,
                     const MixingRow& row, bool torch_codec);

  /// Start the float32 round: x_hat_i = the parameters, sent to every
  /// neighbour, their x_hat_j received into the copies. Returns the bytes
  /// this rank sends. `tag` identifies the bucket on the wire; the messages
  /// go out as `round` schedules them (link_exchange.hpp).
  uint64_t start_sync(sdk::CommView& comm, int32_t tag, RoundSchedule& round);
  /// Start a compressed round from the (stepped) parameters: encode z_i,
  /// send it, receive the neighbours'. Returns the bytes this rank sends.
  uint64_t start(sdk::CommView& comm, int32_t tag, RoundSchedule& round);
  /// Wait for the started round (after round.run()) and apply it (compressed: the decoded
  /// differences to the copies, then x_i = x_hat_i). Throws the
  /// communicator's error (naming the peer) on failure.
  void finish();
  /// Drop a started round (after a failure elsewhere).
  void abandon();

  /// Elements of the bucket (padding included) and bytes of one compressed
  /// message.
  int64_t length() const { return self_.numel(); }
  uint64_t message_bytes() const;
  /// Bytes of the copies (x_hat_i and one per neighbour).
  uint64_t state_bytes() const;

  /// Put x_hat_i under `prefix`self, x_hat_j under `prefix`peer<j> and the
  /// bucket's layout (param index, offset, numel per entry, int64) under
  /// `prefix`layout (all RANK_LOCAL).
  void save(sdk::StateWriter& w, const std::string& prefix) const;
  /// Whether `r` holds every key save() puts, for this bucket's layout
  /// (the caller checks that this rank saved a copy of every neighbour:
  /// find() sees any rank's RANK_LOCAL key).
  bool saved_in(const sdk::StateReader& r, const std::string& prefix) const;
  /// Read what save() put (call only when saved_in).
  void load(const sdk::StateReader& r, const std::string& prefix);

 private:
  at::Tensor layout() const;
  void start_exchange(sdk::CommView& comm, const at::Tensor& send, std::vector<at::Tensor>& recv,
                      int32_t tag, RoundSchedule& round);

  const dopt_bucket* bucket_;
  sdk::BucketParams params_;  // the bucket's parameters, packed and unpacked
  MixingRow row_;
  at::Tensor self_;                 // x_hat_i
  std::vector<at::Tensor> copies_;  // x_hat_j, per link of row_
  at::Tensor z_, decoded_;          // float32 work buffers (decoded_: torch codec only)
  at::Tensor send_;                 // uint8 message
  std::vector<at::Tensor> recv_;    // uint8 messages, per link
  LinkExchange links_;
  bool torch_codec_ = false;
  bool compressed_ = false;  // what the started round is
  bool started_ = false;
};

}  // namespace distopt::plugins::decentralized
