// The `powersgd` reducer: PowerSGD (Vogels, Karimireddy, Jaggi, "PowerSGD:
// Practical Low-Rank Gradient Compression for Distributed Optimization",
// NeurIPS 2019), with the options and behaviour of PyTorch's powerSGD_hook
// (torch.distributed.algorithms.ddp_comm_hooks) and mlbench's PowerSGD
// (`rank`, `reuse_query`).
//
// Per bucket and step (after `start_iter` plain-average steps):
//   - every entry of 2+ dims is a matrix M (n x m: dim 0 x the rest folded);
//     with r = min(rank, n, m) it is compressed when (n + m) r *
//     min_compression_rate < n m, otherwise it goes with the 1-D entries;
//   - M += E (error feedback: E is this rank's residual of the last step);
//   - Q (m x r) is orthonormalised (warm start: last step's Q; else fresh
//     Gaussian from `seed`, identical on every rank), P = M Q;
//   - ONE allreduce (average) carries every P of the bucket plus every
//     uncompressed entry (biases, small matrices), packed in one buffer;
//   - P is orthonormalised (orthogonalize.hpp, bit-identical on every rank),
//     Q = M^T P, ONE allreduce (average) of every Q of the bucket;
//   - the bucket gets P Q^T (= the rank-r approximation of the average of
//     the M's) and E = M - P Q^T.
// With r = min(n, m) (and min_compression_rate 0 so the matrix is
// compressed) P Q^T is the exact average.
//
// Asynchrony: reduce() only enqueues the bucket and returns; one worker
// thread per reducer runs the queued buckets in FIFO order (the matmuls, the
// two dependent allreduces and the write-back). All of this reducer's
// collectives are issued by that thread, so they are issued in the same order
// on every rank whatever the timing of reduce/test/wait calls, and the
// autograd thread never blocks on the P -> Q dependency. The request's
// test/wait observe the worker's completion (errors, e.g. a dead peer, come
// back from wait with the communicator's detail).
//
// Thread safety: reduce, bytes_sent and the requests may be called from any
// thread. Buckets must be reduced in the same order on every rank (reducer.h).
// Buckets must not be touched by the caller until their request completes.
//
// Supported bucket dtypes: float32 and float64 (math in that dtype), float16
// and bfloat16 (math, residuals and P/Q traffic in float32).
//
// Devices: the matmuls, error feedback and packing are libtorch
// ops on the bucket's device, and the collectives take device tensors.
// Option `kernels` picks the orthogonalisation: auto (the CPU loop over host
// pointers for kDLCPU buckets, orthogonalize_columns_generic's libtorch ops
// on the bucket's device otherwise), cpu (host buckets only), generic (the
// libtorch version on host buckets too: the tests compare them). Fresh
// Gaussian Q's are always drawn on the host from the CPU generator seeded
// with `seed` and copied to the device, so the draws, and the generator
// state that checkpoints hold, do not depend on the device. Device kernels
// run on the worker thread's current stream (the default stream), which the
// communicator's default caller stream orders after (communicator.h).
//
// State: per bucket, the residuals E (one float per compressed element), the
// Q's (warm start) and the step count, plus the reducer's Q generator.
// save_state / load_state checkpoint all of it, so that a resumed run
// reduces exactly as an uninterrupted one (see save_state for the keys).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::powersgd {

/// Which orthogonalisation runs (option `kernels`, see above).
enum class Kernels { kAuto, kCpu, kGeneric };

/// The reducer's options (see plugin.cpp for the schema and defaults).
struct PowerSgdOptions {
  int64_t rank = 4;                   ///< r, the approximation rank
  bool warm_start = true;             ///< reuse Q between steps (alias reuse_query)
  int64_t start_iter = 10;            ///< plain average for each bucket's first steps
  double min_compression_rate = 2.0;  ///< compress iff (n + m) r * rate < n m; 0: always
  uint64_t seed = 0;                  ///< initial / fresh Q's (same on every rank)
  Kernels kernels = Kernels::kAuto;   ///< CPU loop vs libtorch orthogonalisation
};

/// How one bucket entry is reduced. Offsets are in elements.
struct EntryPlan {
  std::string name;              ///< the parameter's name (checkpoint keys)
  std::vector<int64_t> shape;    ///< the parameter's shape
  size_t offset = 0, numel = 0;  ///< in the bucket's flat buffer
  int64_t n = 0, m = 0, r = 0;   ///< matrix view and effective rank (compressed only)
  bool compressed = false;
  size_t p_off = 0;  ///< compressed: its P (n x r) in the P buffer; else its values there
  size_t q_off = 0;  ///< compressed: its Q (m x r) in the Q buffer
  size_t e_off = 0;  ///< compressed: its residual (n x m) in the residual buffer
};

/// The reduction plan of one bucket: which entries are compressed and where
/// their P / Q / residual / uncompressed values live in the packed buffers.
/// The P buffer holds every P, then every uncompressed entry's values.
struct BucketPlan {
  std::vector<EntryPlan> entries;
  size_t flat_numel = 0;          ///< the bucket's flat length (incl. padding)
  size_t p_numel = 0;             ///< P's + uncompressed values
  size_t p_compressed_numel = 0;  ///< the P's alone (prefix of the P buffer)
  size_t q_numel = 0, e_numel = 0;
  size_t num_compressed = 0;
};

/// Plan a bucket (pure; throws sdk::Error(INVALID_ARGUMENT) on an entry that
/// does not fit in the flat buffer or has a bad shape).
BucketPlan plan_bucket(const dopt_bucket& bucket, const PowerSgdOptions& opts);

class PowerSgdReducer : public sdk::Reducer {
 public:
  /// ABI 1.4 devices: host memory, and CUDA memory through the generic
  /// orthogonalisation (libtorch ops only, no host reads of bucket data).
  /// CUDA: world size 1 on an H200 (STATUS.md).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  /// Options from args.options (the plugin's schema). Plans the given buckets
  /// (state is sized lazily, at a bucket's first compressed step). Starts the
  /// worker thread. Throws sdk::Error on a bad communicator or bucket.
  PowerSgdReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
                  size_t num_buckets);
  /// Stops the worker after its current bucket; queued buckets fail with
  /// DOPT_ERR_ABORTED.
  PowerSgdReducer(const PowerSgdReducer&) = delete;
  PowerSgdReducer& operator=(const PowerSgdReducer&) = delete;

  /// Enqueue `bucket` (its flat buffer is reduced in place by the worker)
  /// and return its request at once.
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override;
  /// Ring-allreduce traffic actually sent by this rank: per plain step
  /// 2(W-1)/W x flat bytes; per compressed step the same of the P(+
  /// uncompressed) buffer plus the Q buffer.
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }

  /// Checkpoints (distopt/state.h). Per parameter of every bucket:
  ///   powersgd/step/<name>    int64 scalar, its bucket's reduction count
  ///                           (start_iter logic); SHARDED, put by rank 0
  /// and, per compressed matrix once its bucket has compressed once:
  ///   error_feedback/<name>   RANK_LOCAL residual E, the parameter's shape,
  ///                           float32 (float64 for float64 buckets)
  ///   powersgd/q/<name>       the warm-start Q, m x r, the same on every
  ///                           rank (it is an allreduce's result); SHARDED,
  ///                           put by rank 0
  /// and once: powersgd/rng (uint8, the Q generator's state; rank 0).
  /// Called between steps (no bucket queued). Thread-safe against bytes_sent.
  void save_state(sdk::StateWriter& w) override;
  /// Restore what save_state put, before the first reduce. Rules:
  ///  - another saved world size: each rank's residual is the mean of the
  ///    saved ranks' (the host's rule), logged as a warning on rank 0;
  ///  - a Q saved with another shape (the `rank` option changed) is
  ///    replaced by a fresh Gaussian Q from the generator, with a warning
  ///    naming the key: Q is only the power iteration's starting point, so
  ///    this costs accuracy for a few steps, not correctness;
  ///  - a residual for a matrix that is no longer compressed (`rank` or
  ///    `min_compression_rate` changed) is dropped with a warning;
  ///  - missing keys (a checkpoint of a stateless reducer) are a warning,
  ///    and that state starts fresh (zero residual, step 0);
  ///  - a residual with another element count throws INVALID_ARGUMENT
  ///    naming the key (not the same model).
  void load_state(const sdk::StateReader& r) override;

  const PowerSgdOptions& options() const { return opts_; }

  struct Job;
  struct BucketState;

 private:
  void run_job(Job& job);
  BucketState& state_for(const dopt_bucket& bucket);

  PowerSgdOptions opts_;
  sdk::CommView comm_;
  int32_t rank_;
  int32_t world_size_;
  // Draws every fresh Q; used by the worker (and load_state before any
  // reduce), seeded with `seed`: every rank draws the same Q's in the same
  // bucket order. A member rather than thread-local so checkpoints hold it
  // (an at::Generator behind a pointer: this header stays torch-free).
  struct Rng;
  std::unique_ptr<Rng> rng_;
  std::atomic<uint64_t> bytes_sent_{0};

  std::mutex states_mu_;  // guards states_ (created on reduce(), used by the worker)
  std::vector<std::unique_ptr<BucketState>> states_;  // by bucket index

  sdk::SerialWorker worker_{"powersgd"};  // last: stops before the state above goes
};

}  // namespace distopt::plugins::powersgd
