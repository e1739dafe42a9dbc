// Gradient buckets of one DistributedOptimizer (DDP's Reducer with
// gradient_as_bucket_view, Bagua's bucketing): flat buffers per bucket, every
// parameter's .grad a view into its bucket, and autograd post hooks on the
// gradient accumulators that hand complete buckets to the algorithm, in
// bucket order, while backward is still running.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/buckets.hpp"
#include "distopt/reducer.h"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/bucket_plan.hpp"
#include "optim/storage.hpp"

namespace torch::autograd {
struct Node;
}

namespace distopt::optim {

struct BucketOptions {
  double cap_bytes = kDefaultBucketCapMb * 1024 * 1024;
  size_t align_bytes = kDefaultAlignBytes;
  bool overlap =
      kDefaultOverlap;  ///< false: Bagua's delay_reduce, every bucket launched at finish()
  /// Bytes per element used to plan (cap and alignment) instead of each
  /// parameter's own; 0 = its own. Mixed precision plans with 4 (fp32), so
  /// the fp32 master buckets get the layout an fp32 model would have.
  size_t plan_element_size = 0;
  /// Parameter sharding: per parameter (constructor order) its unit, or -1;
  /// empty: no units. A unit's trainable parameters get one bucket of their
  /// own (bucket_plan.hpp), whose memory exists only while a step needs it
  /// (release_unit_grads).
  std::vector<int> units;
};

/// Not copyable or movable (the hooks point at it). Thread-safe between the
/// autograd thread (hooks) and the training thread (zero_grad / finish).
class BucketManager {
 public:
  /// Called with a bucket index when that bucket is complete; buckets are
  /// launched strictly in index order, once per step. May throw (the error
  /// then surfaces from backward() or finish()).
  using LaunchFn = std::function<void(const dopt_bucket&)>;

  /// `params` in registration order; those with requires_grad get a slot
  /// (dense, contiguous tensors only: throws distopt::Error otherwise). Any
  /// existing .grad is copied into its slot. Hooks are installed at once.
  BucketManager(const std::vector<std::pair<std::string, at::Tensor>>& params,
                const BucketOptions& opts, LaunchFn launch);
  ~BucketManager();
  BucketManager(const BucketManager&) = delete;
  BucketManager& operator=(const BucketManager&) = delete;

  size_t num_buckets() const { return buckets_.size(); }
  const dopt_bucket* buckets() const { return descs_.data(); }
  /// The gradient view of parameter i (undefined tensor for a frozen one).
  const at::Tensor& grad_view(size_t i) const { return params_[i].view; }
  /// Bytes of bucket b's flat buffer.
  uint64_t bucket_bytes(size_t b) const;
  /// Bucket b's flat buffer (the gradients' storage).
  const at::Tensor& flat(size_t b) const { return buckets_.at(b).flat; }
  /// The unit whose parameters bucket b holds (BucketOptions::units), or -1.
  int unit_of_bucket(size_t b) const { return buckets_.at(b).unit; }

  /// Parameter sharding: `fn(i)` runs (under the manager's lock, on the
  /// autograd thread) each time parameter i of a unit's bucket got its
  /// gradient of a backward, under no_sync too.
  void on_unit_grad(std::function<void(size_t)> fn) { unit_grad_ = std::move(fn); }
  /// Parameter sharding: `fn(n)` runs (under the manager's lock, on the
  /// autograd thread) before a unit's bucket gets memory in a backward that
  /// sends, when buckets 0..n-1 were already launched in this step (n > 0).
  void on_unit_bucket_alloc(std::function<void(size_t)> fn) { unit_alloc_ = std::move(fn); }
  /// Units' gradient buckets take and give back their memory through `pool`.
  void set_storage_pool(std::shared_ptr<StoragePool> pool) { pool_ = std::move(pool); }
  /// Parameter sharding: free the memory of every unit's bucket and set its
  /// parameters' .grad to undefined. The next gradient of such a parameter
  /// allocates its bucket again (zeroed) and lands there, so between steps a
  /// rank holds no unit's full gradient. Training thread, between steps.
  void release_unit_grads();
  /// The same for unit bucket b alone (the algorithm is done reading it).
  void release_unit_grad(size_t b);

  /// Zero every bucket and re-point .grad at the bucket views (a user's
  /// module.zero_grad() may have reset them); re-hook parameters whose
  /// gradient accumulator was replaced. Throws distopt::Error if a bucket
  /// was launched by a backward whose step() has not run.
  void zero_grad();
  /// Launch, in order, every bucket not launched yet (entries that got no
  /// gradient this step are zeroed first, except where the parameter's
  /// accumulator was replaced: its gradient reached .grad without the hook),
  /// then start a new step.
  void finish();
  /// Remove the hooks (idempotent); after this backward no longer launches.
  void detach();
  /// Gradient accumulation (DDP's no_sync): while on, a gradient only
  /// accumulates in its bucket view and launches nothing; the next backward
  /// with it off launches the buckets with the accumulated sums, and so does
  /// finish() (a parameter that got a gradient while on counts as ready).
  void set_no_sync(bool on);
  bool no_sync() const;

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    at::Tensor view;  // undefined for frozen parameters
    int bucket = -1;
    std::shared_ptr<torch::autograd::Node> accumulator;
    uintptr_t hook_key = 0;
    bool ready = false;
    bool accumulated = false;  // got a gradient under no_sync this step
  };
  struct Bucket {
    int unit = -1;  // parameter sharding: its unit (memory only while needed)
    at::Tensor flat;
    sdk::DLView flat_dl;
    std::vector<size_t> params;  // entries, in bucket order
    std::vector<dopt_bucket_entry> entries;
    std::vector<std::vector<int64_t>> shapes;
    size_t pending = 0;
    bool launched = false;
  };

  void on_grad_ready(size_t i);
  void hook(size_t i);
  // Autograd makes a new AccumulateGrad node for a parameter after set_
  // (torch::load into a module does it): move the hook there. True when it moved.
  bool rehook_if_replaced(size_t i);
  void ensure_view(Param& p);
  /// A unit's bucket whose memory was released: allocate it again, zeroed.
  void ensure_allocated(Bucket& bk);
  bool allocated(const Bucket& bk) const;
  void launch_in_order_locked();
  void launch_locked(size_t b);
  void reset_step_locked();

  BucketOptions opts_;
  LaunchFn launch_;
  std::function<void(size_t)> unit_grad_;
  std::function<void(size_t)> unit_alloc_;
  std::shared_ptr<StoragePool> pool_;  // units' gradient buckets (null: the allocator)
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<dopt_bucket> descs_;
  std::recursive_mutex mu_;
  size_t next_ = 0;  // first bucket not launched yet
  bool attached_ = false;
  bool no_sync_ = false;
};

}  // namespace distopt::optim
