// Parameter sharding on the host's side (algorithm.h, "Parameter sharding";
// FSDP's FlatParameter handles, Zhao et al. VLDB'23): per unit, the buffer
// its full parameters live in while gathered, the order units run in, and
// the policy: gather before forward, free after (FULL) or keep until the
// backward (KEEP_FOR_BACKWARD), gather again before backward, free once the
// unit's gradients went to the algorithm, and issue the next unit's gather
// ahead in both directions (one unit in flight).
//
// Between gathers a unit's parameters are empty tensors of their dtype and
// device (numel 0: a read fails with a shape error rather than touching
// freed memory); while gathered they are views of the unit's full buffer.
// The buffer's storage is freed in place, so tensors autograd saved in the
// forward (views of the parameters) see the memory again after the
// backward's gather.
//
// Thread safety: the hooks run on the training thread (forward) and the
// autograd thread (backward); one mutex orders them.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/algorithm.h"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sharded_unit.hpp"
#include "optim/storage.hpp"

namespace distopt::optim {

class ParamShards : public UnitHooks, public std::enable_shared_from_this<ParamShards> {
 public:
  /// One unit: its bucket and parameters (index, tensor, offset in elements
  /// in the bucket's layout).
  struct Member {
    size_t param = 0;
    at::Tensor tensor;
    size_t offset = 0;
    std::vector<int64_t> shape;
  };
  struct UnitSpec {
    std::string name;  ///< the wrapper's module name, for messages
    const dopt_bucket* bucket = nullptr;
    std::vector<Member> members;
    size_t numel = 0;  ///< full buffer: the bucket length rounded up to the world size
  };
  /// `mode`: DOPT_PARAM_SHARDING_FULL or _KEEP_FOR_BACKWARD. The algorithm
  /// must outlive this object. Call free_all() after the algorithm's create
  /// (the parameters become empty tensors). Held by shared_ptr (the
  /// backward hooks hold it weakly).
  /// `pool` keeps freed full buffers for the next gathers (a few blocks, as
  /// CUDA's caching allocator keeps memory reserved); the host's gradient
  /// buckets may share it.
  ParamShards(std::vector<UnitSpec> units, int32_t mode, const dopt_algorithm_v1* avt,
              dopt_algorithm* alg, std::string who, std::shared_ptr<StoragePool> pool);
  ~ParamShards() override;

  void before_forward(int unit) override;
  void after_forward(int unit, const at::Tensor& output) override;
  /// Member `member` of `unit` got its gradient of this backward; once all
  /// have, the unit's backward is over and its parameters can go.
  void grad_ready(int unit, size_t member);
  /// End of a step: free every unit still gathered; the forward order seen
  /// in this step becomes the prefetch order.
  void end_step();
  /// Gather every unit and keep them until release_all (checkpoints,
  /// evaluation outside the units' forwards). Collective.
  void gather_all();
  void release_all();
  /// While gather_all holds them: hand every unit's (changed) full
  /// parameters back to the algorithm's shards (checkpoint restore). Local.
  void scatter_all();
  /// Free every unit, pinned or not (after create; on destruction).
  void free_all();
  /// Unit u's full parameters gathered into a new 1-D buffer of `dtype`
  /// (laid out as the unit's bucket), leaving the unit as it is: under mixed
  /// precision, kFloat gathers the fp32 masters the algorithm shards
  /// (checkpoints, rebuilds). Collective; between steps.
  at::Tensor gather_copy(size_t u, at::ScalarType dtype);
  /// Set the algorithm's shard of unit u from `full` (gather_copy's layout,
  /// any floating dtype). Local; between steps.
  void scatter_copy(size_t u, const at::Tensor& full);
  /// Unit u's spec (its parameters and their offsets).
  const UnitSpec& unit(size_t u) const { return units_.at(u).spec; }
  /// Local, for a teardown where no collective can run (elastic recovery
  /// after a rank died): every unit's parameters become zeros of their full
  /// shape, so that an optimizer can be built on the model again; the
  /// values must come from a restore. Takes the whole model's bytes.
  void unshard_locally();
  /// Units whose hooks point here (make_optimizer's wrappers); detached on
  /// destruction so a wrapper outliving the optimizer just forwards.
  void attach(std::vector<std::shared_ptr<UnitSlot>> slots);
  /// Point the units back here (another optimizer attached them, and failed).
  void attach_again();

  size_t num_units() const { return units_.size(); }
  /// Bytes of full buffers present now (the memory test reads it).
  uint64_t gathered_bytes() const;
  /// Most bytes of full buffers present at once since the last call.
  uint64_t take_peak_gathered_bytes();
  /// Bytes of freed blocks kept for reuse (the pool's).
  uint64_t cached_bytes() const { return pool_->kept_bytes(); }

 private:
  enum class State { freed, pending, ready };
  struct Unit {
    UnitSpec spec;
    at::Tensor full;  // storage freed while State::freed
    sdk::DLView full_dl;
    std::vector<at::Tensor> placeholders;  // per member: empty, its dtype and device
    State state = State::freed;
    bool pinned = false;         // gather_all: keep until release_all
    std::vector<bool> got_grad;  // per member, in this backward
    size_t grads = 0;
  };
  void before_backward(int unit);
  void gather_locked(size_t u);
  void wait_locked(size_t u);
  void release_locked(size_t u);
  void prefetch_locked(size_t u, int direction);
  void note_peak_locked();
  void check(dopt_status s, const std::string& what) const;

  std::vector<Unit> units_;
  int32_t mode_;
  const dopt_algorithm_v1* avt_;
  dopt_algorithm* alg_;
  std::string who_;
  std::mutex mu_;
  std::vector<size_t> order_, seen_;  // forward order: last step's, and this step's so far
  std::vector<int> position_;         // unit -> index in order_, or -1
  bool end_of_backward_queued_ = false;
  std::vector<std::shared_ptr<UnitSlot>> slots_;
  uint64_t peak_ = 0;
  std::shared_ptr<StoragePool> pool_;
};

}  // namespace distopt::optim
