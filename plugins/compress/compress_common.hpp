// Shared pieces of the `compress` reducers: the per-bucket layout copied at
// create time, float32 working copies of a bucket whatever its dtype, the
// request that finishes (decompresses) a reduction once its collective is
// done, and the byte formulas every reducer reports through bytes_sent.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/sdk/sdk.hpp"
#include "distopt/sdk/traffic.hpp"

namespace distopt::plugins::compress {

/// One parameter's slice of a bucket (elements, from the flat buffer's start).
struct Slice {
  size_t offset = 0;
  size_t numel = 0;
  std::string name;            ///< the parameter's name: checkpoint keys
  std::vector<int64_t> shape;  ///< the parameter's shape (checkpoint entries)
};

/// What a reducer remembers of one bucket from create(): its flat length,
/// dtype and entries. reduce() checks the bucket it gets against it.
struct BucketLayout {
  size_t length = 0;  ///< elements of the flat buffer, padding included
  DLDataType dtype{};
  std::vector<Slice> entries;
  size_t payload = 0;  ///< sum of entries' numel (padding excluded)
};

/// Layouts of the buckets handed to create(); throws sdk::Error
/// (INVALID_ARGUMENT / UNSUPPORTED) naming `who` for a bucket that is not
/// 1-D, contiguous host memory of float32/64, float16 or bfloat16, or whose
/// entries do not fit its flat buffer.
std::vector<BucketLayout> read_layouts(const char* who, const dopt_bucket* buckets, size_t n);

/// The layout of `bucket` (by index), checked against what reduce() got.
const BucketLayout& layout_of(const char* who, const std::vector<BucketLayout>& layouts,
                              const dopt_bucket& bucket);

/// Copy the bucket's flat buffer into `out` as float32 (resized to length).
void load_float(const DLTensor& flat, std::vector<float>& out);
/// Write `in` (float32, the flat length) back into the bucket's dtype (RNE).
void store_float(const std::vector<float>& in, DLTensor& flat);

/// A 1-D DLTensor over `count` elements of host memory at `data`.
/// `shape` must outlive it.
DLTensor host_tensor(void* data, int64_t count, DLDataType dtype, int64_t* shape);

inline constexpr DLDataType kU8{kDLUInt, 8, 1};
inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kF16{kDLFloat, 16, 1};
inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};

using sdk::allgather_bytes;  // distopt/sdk/traffic.hpp
using sdk::ring_allreduce_bytes;
/// A bucket reduction: one collective in flight, then `finish` (decompress
/// into the bucket) runs exactly once, on the first thread whose test() or
/// wait() sees the collective complete. Thread-safe.
class StagedRequest : public sdk::Request {
 public:
  StagedRequest(sdk::CommHandle h, std::function<void()> finish)
      : h_(std::move(h)), finish_(std::move(finish)) {}
  bool test() override;
  bool wait(int64_t timeout_ms) override;

 private:
  std::mutex mu_;
  bool done_ = false;
  sdk::CommHandle h_;
  std::function<void()> finish_;
};

class MomentumCorrection;

/// Base of the compress reducers: communicator, world, layouts, byte count.
class CompressReducer : public sdk::Reducer {
 public:
  /// ABI 1.4 devices: host memory only: the codecs read and write the buckets through raw
  /// host pointers (memcpy, per-element loops on data()).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU);
  CompressReducer(const char* who, const dopt_create_args& args, dopt_comm_ref comm,
                  const dopt_bucket* buckets, size_t num_buckets);
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }

 protected:
  /// Add to this reducer's count and to the job metric reducer.bytes_sent.
  void count_sent(uint64_t bytes);

  /// Checkpoint the error-feedback residuals (`residual[b]`: float32 over
  /// bucket b's flat buffer, or empty for none): one DOPT_STATE_RANK_LOCAL
  /// entry "error_feedback/<param name>" per bucket entry, float32, the
  /// parameter's shape (distopt/state.h's convention, so residuals move
  /// between the EF reducers).
  void save_residuals(sdk::StateWriter& w, const std::vector<std::vector<float>*>& residual) const {
    save_rank_local(w, "error_feedback/", residual);
  }
  /// Restore what save_residuals put. Another saved world size gives each
  /// rank the mean of the saved residuals (the host's rule for floating
  /// RANK_LOCAL entries; logged as a warning on rank 0). A missing key is
  /// a warning and a zero residual (e.g. error_feedback was off when saved);
  /// a saved tensor with another element count throws INVALID_ARGUMENT
  /// naming the key. Values of bucket padding are left as they are.
  void load_residuals(const sdk::StateReader& r,
                      const std::vector<std::vector<float>*>& residual) const {
    load_rank_local(r, "error_feedback/", "error-feedback residual", residual);
  }
  /// The same for any per-element float32 buffers under "<prefix><param
  /// name>" (MomentumCorrection's velocity: "momentum_correction/");
  /// `what` names them in warnings.
  /// save_residuals(residual), and the velocity of `momentum` under
  /// kVelocityPrefix when it is enabled: what every EF reducer checkpoints.
  void save_feedback_state(sdk::StateWriter& w, const std::vector<std::vector<float>*>& residual,
                           MomentumCorrection& momentum) const;
  /// The inverse (load_rank_local's rules for missing keys / world sizes).
  void load_feedback_state(const sdk::StateReader& r,
                           const std::vector<std::vector<float>*>& residual,
                           MomentumCorrection& momentum) const;
  void save_rank_local(sdk::StateWriter& w, const std::string& prefix,
                       const std::vector<std::vector<float>*>& buffers) const;
  void load_rank_local(const sdk::StateReader& r, const std::string& prefix,
                       const std::string& what,
                       const std::vector<std::vector<float>*>& buffers) const;

  const char* who_;
  sdk::CommView comm_;
  int32_t rank_;
  int32_t world_size_;
  std::vector<BucketLayout> layouts_;
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace distopt::plugins::compress

namespace distopt::plugins::compress {

/// Momentum correction with momentum factor masking for the sparsifying
/// reducers (Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression",
/// ICLR 2018, section 3.2). Each rank keeps a velocity u per parameter
/// element and accumulates u, not the gradient, into the error-feedback
/// residual:
///   u = momentum x u + g;   p = e + u;   send sparse(p);   e = p - sent
/// and, with masking, u = 0 where an element was sent, so a stale velocity
/// does not keep pushing a coordinate whose accumulated update just went
/// out. The momentum then lives here: the optimizer must run without it
/// (optimizer.momentum: 0), as in DGC. State: one float32 per element.
inline constexpr const char* kVelocityPrefix = "momentum_correction/";

class MomentumCorrection {
 public:
  /// momentum in [0, 1); 0 turns it off (accumulate() is then p = g).
  MomentumCorrection(double momentum, bool masking, const std::vector<BucketLayout>& layouts);
  bool enabled() const { return momentum_ > 0; }
  /// g (one entry of bucket b, in place) becomes the new velocity.
  void accumulate(size_t b, const Slice& e, float* g);
  /// Element `index` of bucket b's flat buffer was sent.
  void sent(size_t b, size_t index) {
    if (masking_ && enabled()) velocity_[b][index] = 0.0f;
  }
  /// Per bucket, for checkpoints (nullptr when disabled).
  std::vector<std::vector<float>*> buffers();

 private:
  float momentum_;
  bool masking_;
  std::vector<std::vector<float>> velocity_;
};

/// Entries kept per tensor by topk / randomk: k = max(min_k, ceil(ratio x n)),
/// at most n (ratio in (0, 1], min_k >= 1; computed in double). min_k keeps
/// small tensors (biases, a classifier's output layer) from being starved:
/// at ratio 0.01 a 10-element bias would send 1 element a step.
size_t keep_count(double ratio, size_t n, size_t min_k = 1);

/// The sparsifiers' shared options (topk, randomk): ratio, min_k,
/// error_feedback, momentum, momentum_masking. Throws INVALID_ARGUMENT.
struct SparseOptions {
  double ratio = 0.01;
  size_t min_k = 1;
  bool error_feedback = true;
  double momentum = 0;
  bool momentum_masking = true;
  static SparseOptions read(const char* who, const dopt_options* options);
  size_t keep(size_t n) const { return keep_count(ratio, n, min_k); }
};

/// Read and check the `ratio` option (0 < ratio <= 1); throws INVALID_ARGUMENT.
double read_ratio(const char* who, const dopt_options* options);

}  // namespace distopt::plugins::compress
