// Shared pieces of the `compress` reducers: the per-bucket layout copied at
// create time, float32 working copies of a bucket whatever its dtype, the
// request that finishes (decompresses) a reduction once its collective is
// done, and the byte formulas every reducer reports through bytes_sent.
//
// Two implementations of every codec: the CPU kernels (plain
// loops over raw host pointers, F16C casts; the faster ones on host memory)
// and a device-generic path written only with libtorch ops on tensors of the
// bucket's device, end to end (compress, the collective on device tensors,
// decompress, error feedback; no host round trip of bucket data). The
// `kernels` option picks one per bucket: auto (CPU kernels for kDLCPU
// buckets where they are faster, i.e. all but bf16's; the generic path for
// any other device), cpu, generic (also on
// host buckets: the tests compare both paths that way). Both paths send the
// same wire format, count the same bytes and keep the same state, so ranks
// may mix them and checkpoints move between them.
//
// Device work (generic path on kDLCUDA): kernels are enqueued on the calling
// thread's current stream; the communicator orders its collective after its
// caller stream (communicator.h; the default, the legacy stream, orders after
// every blocking stream), and a request's test() / wait() runs the
// decompression after the collective's wait(), so the bucket's result is
// ordered on the current stream of the thread that completed the request.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/base/traffic.hpp"
#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::compress {

/// One parameter's slice of a bucket (elements, from the flat buffer's start).
struct Slice {
  size_t offset = 0;
  size_t numel = 0;
  std::string name;            ///< the parameter's name: checkpoint keys
  std::vector<int64_t> shape;  ///< the parameter's shape (checkpoint entries)
};

/// Which implementation reduces a bucket (option `kernels`).
enum class Kernels {
  kAuto,     ///< CPU kernels for kDLCPU buckets, the generic path for other devices
  kCpu,      ///< CPU kernels only (a non-CPU bucket is refused at create)
  kGeneric,  ///< libtorch ops on the bucket's device, whatever it is
};
/// Read the `kernels` option ("auto" | "cpu" | "generic"); throws
/// INVALID_ARGUMENT naming `component` for another value.
Kernels read_kernels(const char* component, const dopt_options* options);

/// What a reducer remembers of one bucket from create(): its flat length,
/// dtype, device and entries. reduce() checks the bucket it gets against it.
struct BucketLayout {
  size_t length = 0;  ///< elements of the flat buffer, padding included
  DLDataType dtype{};
  at::Device device{at::kCPU};  ///< where the bucket (and this reducer's state for it) lives
  bool generic = false;         ///< reduced by the device-generic path (Kernels)
  std::vector<Slice> entries;
  size_t payload = 0;  ///< sum of entries' numel (padding excluded)
  /// Generic path: int64 flat indices of the padding (elements in no
  /// entry), on `device`; undefined when there is none.
  at::Tensor pad_index;
};

/// Layouts of the buckets handed to create(); throws sdk::Error
/// (INVALID_ARGUMENT / UNSUPPORTED) naming `component` for a bucket that is not
/// 1-D, contiguous memory of float32/64, float16 or bfloat16 on kDLCPU or
/// kDLCUDA, or whose entries do not fit its flat buffer, and (UNSUPPORTED)
/// for a non-CPU bucket with kernels == kCpu. Sets `generic` per bucket
/// from `kernels` and builds the generic path's index tensors on the
/// bucket's device.
std::vector<BucketLayout> read_layouts(const char* component, const dopt_bucket* buckets, size_t n,
                                       Kernels kernels = Kernels::kAuto);

/// The layout of `bucket` (by index), checked against what reduce() got.
const BucketLayout& layout_of(const char* component, const std::vector<BucketLayout>& layouts,
                              const dopt_bucket& bucket);

/// Copy the bucket's flat buffer into `out` as float32 (resized to length).
void load_float(const DLTensor& flat, std::vector<float>& out);
/// Write `in` (float32, the flat length) back into the bucket's dtype (RNE).
void store_float(const std::vector<float>& in, DLTensor& flat);

/// A 1-D DLTensor over `count` elements of host memory at `data`.
/// `shape` must outlive it.
DLTensor host_tensor(void* data, int64_t count, DLDataType dtype, int64_t* shape);

/// Generic path: a float32 copy (a new tensor, on the bucket's device) of
/// the bucket's flat buffer, its padding set to 0 when `zero_padding` (the
/// sparsifiers and signsgd: their state and output are 0 there, as the CPU
/// kernels leave them). Device-generic, no host sync.
at::Tensor load_work(const DLTensor& flat, const BucketLayout& l, bool zero_padding);
/// Generic path: write `work` (float32, the flat length, the bucket's
/// device) into the bucket in its dtype (copy_: round to nearest even, as
/// store_float).
void store_work(const at::Tensor& work, const DLTensor& flat);

inline constexpr DLDataType kU8{kDLUInt, 8, 1};
inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kF16{kDLFloat, 16, 1};
inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};

using sdk::allgather_bytes;  // distopt/sdk/base/traffic.hpp
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
  /// ABI 1.4 devices: host memory (CPU kernels, or the generic path with
  /// kernels: generic) and CUDA memory (the generic path: libtorch ops only,
  /// no host reads of bucket data). CUDA: fp16, signsgd, topk and randomk at
  /// world size 1 on an H200; bf16 never on a GPU (STATUS.md).
  static constexpr uint32_t devices = DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA);
  /// Reads the `kernels` option (every compress reducer has it) and the
  /// buckets' layouts (read_layouts); throws sdk::Error.
  CompressReducer(const char* component, const dopt_create_args& args, dopt_comm_ref comm,
                  const dopt_bucket* buckets, size_t num_buckets);
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }

 protected:
  /// Add to this reducer's count and to the job metric reducer.bytes_sent.
  void count_sent(uint64_t bytes);

  /// Per bucket, a zeroed float32 tensor of its flat length on its device
  /// (the residual / velocity buffers both paths share; the CPU kernels use
  /// data_ptr<float>() of the host ones).
  std::vector<at::Tensor> zero_buffers() const;

  /// Checkpoint the error-feedback residuals (`residual[b]`: float32 over
  /// bucket b's flat buffer on its device, or undefined for none): one DOPT_STATE_RANK_LOCAL
  /// entry "error_feedback/<param name>" per bucket entry, float32, the
  /// parameter's shape (distopt/state.h's convention, so residuals move
  /// between the EF reducers), copied to the host whatever the device, so a
  /// checkpoint of either path and device loads into any other.
  void save_residuals(sdk::StateWriter& w, const std::vector<at::Tensor>& residual) const {
    save_rank_local(w, "error_feedback/", residual);
  }
  /// Restore what save_residuals put. Another saved world size gives each
  /// rank the mean of the saved residuals (the host's rule for floating
  /// RANK_LOCAL entries; logged as a warning on rank 0). A missing key is
  /// a warning and a zero residual (e.g. error_feedback was off when saved);
  /// a saved tensor with another element count throws INVALID_ARGUMENT
  /// naming the key. Values of bucket padding are left as they are.
  void load_residuals(const sdk::StateReader& r, const std::vector<at::Tensor>& residual) const {
    load_rank_local(r, "error_feedback/", "error-feedback residual", residual);
  }
  /// The same for any per-element float32 buffers under "<prefix><param
  /// name>" (MomentumCorrection's velocity: "momentum_correction/");
  /// `what` names them in warnings.
  /// save_residuals(residual), and the velocity of `momentum` under
  /// kVelocityPrefix when it is enabled: what every EF reducer checkpoints.
  void save_feedback_state(sdk::StateWriter& w, const std::vector<at::Tensor>& residual,
                           MomentumCorrection& momentum) const;
  /// The inverse (load_rank_local's rules for missing keys / world sizes).
  void load_feedback_state(const sdk::StateReader& r, const std::vector<at::Tensor>& residual,
                           MomentumCorrection& momentum) const;
  void save_rank_local(sdk::StateWriter& w, const std::string& prefix,
                       const std::vector<at::Tensor>& buffers) const;
  void load_rank_local(const sdk::StateReader& r, const std::string& prefix,
                       const std::string& what, const std::vector<at::Tensor>& buffers) const;

  const char* component_;
  Kernels kernels_;
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
  /// momentum in [0, 1); 0 turns it off (accumulate() is then p = g). The
  /// velocity of bucket b is float32 over its flat buffer, on its device.
  MomentumCorrection(double momentum, bool masking, const std::vector<BucketLayout>& layouts);
  bool enabled() const { return momentum_ > 0; }
  /// CPU kernels: g (one entry of bucket b, in place) becomes the new velocity.
  void accumulate(size_t b, const Slice& e, float* g);
  /// CPU kernels: element `index` of bucket b's flat buffer was sent.
  void sent(size_t b, size_t index) {
    if (masking_ && enabled()) velocity_[b].data_ptr<float>()[index] = 0.0f;
  }
  /// Generic path: the same over the whole flat buffer `g` (float32, the
  /// bucket's device, padding 0 so the velocity's padding stays 0):
  /// u = momentum u + g (two roundings, as the CPU loop); g = u.
  void accumulate(size_t b, at::Tensor& g);
  /// Generic path: the elements at `index` (int64, the bucket's device) were sent.
  void sent(size_t b, const at::Tensor& index);
  /// Per bucket, for checkpoints (one undefined tensor when disabled).
  std::vector<at::Tensor> buffers();

 private:
  float momentum_;
  bool masking_;
  std::vector<at::Tensor> velocity_;
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
  static SparseOptions read(const char* component, const dopt_options* options);
  size_t keep(size_t n) const { return keep_count(ratio, n, min_k); }
};

/// Read and check the `ratio` option (0 < ratio <= 1); throws INVALID_ARGUMENT.
double read_ratio(const char* component, const dopt_options* options);

}  // namespace distopt::plugins::compress
