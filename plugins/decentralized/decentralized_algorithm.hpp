// The `decentralized` algorithm: decentralized SGD (D-PSGD, Lian et al.,
// NeurIPS 2017; Bagua's Decentralized algorithm). Every rank keeps its own
// replica x_i of the parameters. A communication step t (every
// `communication_interval`-th step) computes
//     x_i <- sum_j W_ij x_j        (gossip with the topology's neighbours)
//     x_i <- inner_optimizer(x_i, g_i(x_i before the gossip))
// where W is the topology's doubly stochastic mixing matrix (topology.hpp)
// and g_i is this rank's own gradient: gradients are never reduced (the
// reducer is not used; only one declaring the exact mean is accepted, as it
// would change nothing). Other steps are plain local steps.
//
// Overlap (Bagua): the parameters do not change during backward, so a
// bucket's exchange starts as soon as its gradients are ready (on the
// autograd thread) and step() only waits for it; overlap: false starts
// every exchange in step(). Both compute the same values bitwise.
//
// link_schedule (link_exchange.hpp): every message goes out on the
// receiver's clear-to-send; one_at_a_time (auto when some ranks run on
// other hosts) also gives each link direction one message at a time, a
// rank granting one (bucket, neighbour) and keeping one send in flight at a
// time; all_at_once (auto on one host) sends everything at once. Same
// values bitwise either way; every rank must use the same.
//
// Checkpoints (ABI 1.2 trait DOPT_TRAIT_LOCAL_REPLICAS): the host saves the
// replicas' mean as the model; this algorithm puts its own replica under
// replica/<param> and its inner-optimizer state under local/optimizer/...
// (both RANK_LOCAL: a resume at the same world size continues every rank
// exactly; at another world size every rank reads the mean over the saved
// ranks), plus rank 0's optimizer state under the usual optimizer/... keys
// so that other algorithms load it, and the step counter.
//
// low_precision: true (Bagua's LowPrecisionDecentralizedAlgorithm, DCD-PSGD,
// Tang et al. 2018; low_precision_gossip.hpp): the inner optimizer steps
// first, then every bucket's round exchanges the 8-bit min-max compressed
// difference z_i with the neighbours and sets x_i to the copy x_hat_i all of
// them hold. Static topologies only (ring, exponential, neighbors): a copy of
// a peer is kept current by every one of its differences, which a rotating
// peer (shift_one) or every rank (complete) would not send. `overlap` does
// not apply (the round needs the stepped parameters). Copies are saved as
// RANK_LOCAL state (low_precision/<bucket>/self, .../peer<j>, .../layout, and
// low_precision/peers: whose copies this rank saved); a checkpoint
// without them for this topology, buckets and world size starts them again
// from one float32 round (warned); after a load the first round agrees on
// it across ranks (one allreduce of a float on the parameters' device), since
// a new neighbour may concern some ranks only.
//
// kernels (option): which min-max codec low_precision runs: host
// (minmax_uint8.hpp, CPU buckets only), torch (minmax_uint8_torch.hpp, libtorch
// ops on any device), auto (default: host on CPU, torch elsewhere). Both
// write the same bytes; torch on CPU is how the tests run the device path.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "distopt/sdk/optim/whole_params.hpp"
#include "distopt/sdk/sdk.hpp"
#include "gossip.hpp"
#include "low_precision_gossip.hpp"
#include "topology.hpp"

namespace distopt::plugins::decentralized {

class DecentralizedAlgorithm : public sdk::Algorithm {
 public:
  /// ABI 1.4 devices: host and CUDA memory: gossip, mixing, the inner
  /// optimizer and low_precision's copies and codec are libtorch ops on the
  /// parameters' device (the host codec for CPU buckets under kernels auto);
  /// messages and the copies' agreement flag go through the communicator in
  /// that device's memory. On CUDA it ran at world size 1 only (an H200,
  /// STATUS.md): the CPU tests run the same ops on CPU tensors (kernels: torch).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  static constexpr uint32_t traits = DOPT_TRAIT_LOCAL_REPLICAS;
  /// Refuses an odd world with shift_one, a bad neighbour list, a reducer
  /// that is not an exact mean, mixed precision, and low_precision with
  /// shift_one or complete.
  static void check_job(const sdk::JobView& job);

  explicit DecentralizedAlgorithm(const dopt_algorithm_args& args);
  ~DecentralizedAlgorithm() override;
  void on_bucket_ready(const dopt_bucket& bucket) override;
  void step() override;
  void set_lr(int32_t group, double lr) override;
  /// ABI 1.5: no global gradient exists, so each rank clips its own
  /// gradient by its own norm (no communication).
  void set_grad_clip(double max_norm) override;
  uint64_t state_bytes() const override;
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;
  uint64_t bytes_sent() const override;

 private:
  bool communicates() const { return step_ % interval_ == 0; }
  void start(size_t bucket);
  void abandon_all();
  void low_precision_step();
  /// Run every bucket's low-precision round (sync: the float32 one).
  void low_precision_round(bool sync);
  /// Restore the copies when the checkpoint has them for this job, else
  /// mark them for a float32 round (warned when it had others).
  void load_copies(const sdk::StateReader& r);
  /// Whether `mine` holds on every rank (an allreduce of one float).
  bool every_rank(bool mine);

  sdk::CommView comm_;
  int32_t rank_;
  int32_t world_size_;
  Topology topology_;
  int64_t interval_;
  bool overlap_;
  int64_t step_ = 0;  // steps taken; communication round = step_ / interval_
  std::vector<std::unique_ptr<BucketGossip>> gossip_;
  RoundSchedule round_;  // this round's started buckets: one flow per link direction
  bool low_precision_;
  bool copies_synced_ = false;  // low_precision: the copies hold x_hat
  bool agree_copies_ = false;   // loaded copies: every rank must have its own
  std::vector<std::unique_ptr<LowPrecisionGossip>> low_;
  /// optimizer.grad_clip on this rank's gradient, then one step of params_.
  void clip_and_step();
  double grad_clip_ = 0;     // optimizer.grad_clip (0 = off)
  sdk::WholeParams params_;  // this rank's replica and its inner optimizer
  std::atomic<uint64_t> bytes_{0};
  at::Device device_{at::kCPU};  // the parameters' (first bucket's): the flag's device
};

}  // namespace distopt::plugins::decentralized
