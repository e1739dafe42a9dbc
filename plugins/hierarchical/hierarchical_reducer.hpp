// The `hierarchical` reducer: the mean of a bucket over all ranks computed
// in two levels, so that only a fraction of the bytes crosses nodes
// (Horovod's hierarchical allreduce, HOROVOD_HIERARCHICAL_ALLREDUCE; Bagua's
// hierarchical_reduce). Nodes come from DISTOPT_NODE_ID or the host name
// (node_layout.hpp), exchanged with one allgather at creation; the host's
// communicator is then split into one communicator per node and the
// communicators that cross nodes.
//
// variant `ring` (default), per bucket of B bytes on a node of L ranks:
//   1. reduce-scatter (sum) within the node: local rank j gets its pieces;
//   2. allreduce (sum) of each piece across nodes, among the ranks that
//      hold it (one per node);
//   3. divide by the world size W;
//   4. allgather within the node.
//   With equal node sizes a piece is the classic 1/L shard and the ranks of
//   local index j form one cross-node communicator; unequal sizes (2+1,
//   3+1) cut the bucket into S = the largest node's size pieces, and a
//   smaller node's ranks hold several (PiecePlan). Counts not divisible by
//   S are padded with zeros.
//   Bytes per rank: 2 (L-1)/L x B within the node; 2 (N-1)/N x B/L across
//   nodes for N nodes, 1/L of what a flat ring over the N nodes sends.
// variant `leader`: reduce (sum) to local rank 0 (a reduce-scatter, then
//   each rank sends its shard to it), the leaders allreduce (sum) the whole
//   bucket, divide by W, broadcast within the node.
//
// Sums are exact for integer-valued data, and the division is the one
// `tcp`'s DOPT_REDUCE_AVG does (x / W in the bucket's dtype; 16-bit floats
// in float32, rounded once), so on such data the result is bitwise the
// flat `mean` reducer's.
//
// inner (ABI 1.3): `reducer: {name: hierarchical, options: {variant:
// leader}, inner: {name: powersgd, ...}}` runs another reducer for the
// cross-node step: each leader scales its node's sum by N/W (so that the
// inner's average over the N leaders is the mean over the W ranks, for
// unequal node sizes too) and hands the whole bucket, with its parameters'
// shapes, to the inner over the leaders' communicator; the result is
// broadcast within the node. Only the leader variant takes an inner (a ring
// piece is a 1-D cut through parameters, which PowerSGD cannot use);
// check_job refuses `variant: ring` with `inner:`.
//
// Asynchrony: reduce() enqueues the bucket and returns; one worker thread
// runs the buckets in FIFO order, so every communicator sees its
// collectives in the same order on every rank. A failed collective (a dead
// peer) fails the bucket's request; its wait reports the communicator's own
// message (it names ranks of the sub-communicator: a warning logged with
// it maps them to global ranks).
//
// Supported buckets: CPU or CUDA, 1-D contiguous, float32 / float64 /
// bfloat16 / float16 / int32 / int64 (what `tcp` reduces; the communicator
// decides what it takes). Device memory: the split communicators carry the
// bucket's own memory, the scratch buffers (padding, ring pieces) live on its
// device, the division is a libtorch op there: nothing is staged on the
// host. The worker thread enqueues its ops on its current stream (the
// device's default stream), waits for each collective with wait(), and ends
// a bucket with a one-element copy to the host (which waits for that
// stream), so the bucket is final when its request completes. The node keys
// exchanged at creation are int64 tensors on the first bucket's device.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/sdk.hpp"
#include "node_layout.hpp"

namespace distopt::plugins::hierarchical {

class HierarchicalReducer : public sdk::Reducer {
 public:
  /// ABI 1.4 devices: host and CUDA memory: every step is a communicator call on the
  /// bucket's memory or a libtorch op on its device (never run on a GPU; the
  /// CPU tests run the same code).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  /// Exact mean (ABI 1.2), and wraps an `inner:` reducer (ABI 1.3): the
  /// host keeps EXACT_MEAN only when the inner declares it too.
  static constexpr uint32_t traits = DOPT_TRAIT_EXACT_MEAN | DOPT_TRAIT_WRAPS_REDUCER;

  /// Refuses, at check time: `inner:` with variant ring (at
  /// reducer.options.variant), a hierarchical inner (reducer.inner.name).
  static void check_job(const sdk::JobView& job);

  /// Collective over `comm` (every rank creates it): one allgather of the
  /// node keys, then the splits (1 within nodes; S across nodes for ring,
  /// 1 for leader), then the inner on the leaders. Throws sdk::Error:
  /// INVALID_ARGUMENT for a bad DISTOPT_NODE_ID or communicator, the
  /// communicator's error when a collective fails.
  HierarchicalReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
                      size_t num_buckets);
  /// Stops the worker after its current bucket (queued ones fail with
  /// DOPT_ERR_ABORTED), destroys the inner, then the communicators.
  ~HierarchicalReducer() override;
  HierarchicalReducer(const HierarchicalReducer&) = delete;
  HierarchicalReducer& operator=(const HierarchicalReducer&) = delete;

  /// Enqueue the bucket (reduced in place by the worker); returns at once.
  /// Throws sdk::Error(UNSUPPORTED) for a bucket neither on CPU nor CUDA, or
  /// another dtype.
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override;
  /// intra_bytes() + inter_bytes(). Thread-safe.
  uint64_t bytes_sent() const override { return intra_bytes() + inter_bytes(); }
  /// Bytes this rank sent to ranks of its own node (ring model: a
  /// reduce-scatter or allgather of L blocks sends L-1 blocks, a chain
  /// broadcast the whole buffer from every rank but the last). Also the
  /// job metric "hierarchical.intra_bytes".
  uint64_t intra_bytes() const { return intra_.load(); }
  /// Bytes this rank sent to other nodes, the inner's included. Also the
  /// job metric "hierarchical.inter_bytes".
  uint64_t inter_bytes() const;

  /// Checkpoints. Without an inner nothing is saved (stateless). With one,
  /// the leaders forward it (its keys as it names them: error_feedback/...,
  /// powersgd/...), and rank 0 puts "hierarchical/node_of_rank" (int64, one
  /// entry per rank). load_state hands the inner the saved number of
  /// nodes as its saved world size; a checkpoint of the same world size
  /// with another node layout is refused (INVALID_ARGUMENT): the leaders'
  /// rank-local state would go to other ranks.
  void save_state(sdk::StateWriter& w) override;
  void load_state(const sdk::StateReader& r) override;

  const NodeLayout& layout() const { return layout_; }

  struct Job;
  struct Failure;

 private:
  void make_communicators(const dopt_create_args& args, const dopt_bucket* buckets,
                          size_t num_buckets);
  void run_ring(Job& job);
  void run_leader(Job& job);
  /// numel elements of scratch buffer `which` (0 or 1), of like's dtype and device.
  at::Tensor scratch(int which, int64_t numel, const at::Tensor& like);
  void add_intra(uint64_t bytes);
  void add_inter(uint64_t bytes);
  /// Wait for h; on failure keep it in job's Failure (its wait on the
  /// caller's thread reports the communicator's message) and rethrow.
  void finish(Job& job, sdk::CommHandle& h, const std::string& what,
              const std::vector<int32_t>& group);

  sdk::CommView parent_;
  int32_t rank_ = 0, world_ = 1;
  bool leader_variant_ = false;
  std::string inner_name_;
  NodeLayout layout_;
  // Communicators before the inner: destroyed after it.
  sdk::OwnedComm intra_comm_;                      // this node's ranks
  std::vector<sdk::OwnedComm> piece_comms_;        // ring: piece k's holders (empty if not one)
  std::vector<std::vector<int32_t>> piece_group_;  // ring: global ranks of piece k's comm
  sdk::OwnedComm leaders_;                         // leader: the local ranks 0 (empty elsewhere)
  std::vector<int32_t> leader_ranks_;
  sdk::InnerReducer inner_;
  uint64_t inner_seen_ = 0;  // inner bytes already added to the metric (worker only)

  std::atomic<uint64_t> intra_{0}, inter_{0};
  std::atomic<uint64_t> reductions_{0};
  at::Tensor scratch_[2];  // worker only

  sdk::SerialWorker worker_{"hierarchical"};  // last: stops before the state above goes
};

}  // namespace distopt::plugins::hierarchical
