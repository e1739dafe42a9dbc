// Units of parameter sharding (ZeRO stage 3, PyTorch FSDP's wrapping) for
// libtorch modules, which have no forward hooks: wrap a module in a
// ShardedUnit and its parameters become one unit. With an algorithm that
// shards parameters (`algorithm: {name: zero, options: {stage: 3}}`), each
// rank then keeps 1/W of the unit's parameters between steps; the unit's
// full parameters are gathered just before its forward, freed after it,
// gathered again before its backward and freed after, and the next unit's
// gather is issued ahead (prefetch). With any other algorithm a ShardedUnit
// only forwards to the module it wraps.
//
//   struct NetImpl : torch::nn::Module {
//     NetImpl() {
//       fc1 = register_module("fc1", distopt::ShardedUnit(torch::nn::Linear(784, 1024)));
//       fc2 = register_module("fc2", distopt::ShardedUnit(torch::nn::Linear(1024, 10)));
//     }
//     at::Tensor forward(at::Tensor x) { return fc2(at::relu(fc1(x))); }
//     distopt::ShardedUnit fc1{nullptr}, fc2{nullptr};
//   };
//   auto opt = runtime.make_optimizer(*net);  // finds the units
//
// Names: the wrapper registers the wrapped module's parameters, buffers and
// children as its own, so parameter names stay "fc1.weight" (no extra
// level) and checkpoints are those of the unwrapped model.
//
// Rules: a unit's forward takes and returns tensors (forward(x), or call(f)
// for any other signature); a parameter belongs to the innermost unit that
// holds it. One shared by units that do not nest (tied weights: an
// embedding and an output layer) belongs to the innermost unit enclosing
// them all, or to no unit when none does (FSDP's lowest common ancestor).
// Parameters in no unit stay whole on every rank. Between steps a sharded
// unit's parameters are empty tensors (numel 0): read them inside a
// forward, or through DistributedOptimizer::gather_params.
//
// Thread safety: as the module's own forward (training thread); the hooks
// that gather for backward run on the autograd thread.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <utility>

namespace distopt {

/// What a unit calls around its forward: DistributedOptimizer's parameter
/// sharding attaches one (core-internal), none is attached otherwise.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  /// The unit's full parameters are present when this returns (collective).
  virtual void before_forward(int unit) = 0;
  /// After the forward: free or keep the parameters, and arrange their
  /// gather before the backward that reaches `output` (when it needs grad).
  virtual void after_forward(int unit, const at::Tensor& output) = 0;
};

/// The link between a unit and the optimizer that shards it.
struct UnitSlot {
  UnitHooks* hooks = nullptr;  ///< null: not sharded (the wrapper just forwards)
  int unit = -1;               ///< index among the optimizer's units
};

class ShardedUnitImpl : public torch::nn::Module {
 public:
  /// Wrap `inner` (a ModuleHolder such as torch::nn::Linear, or a
  /// shared_ptr of a module with a forward); an empty holder is refused
  /// with std::invalid_argument.
  template <class M>
  explicit ShardedUnitImpl(torch::nn::ModuleHolder<M> inner)
      : ShardedUnitImpl(torch::nn::AnyModule(std::move(inner))) {}
  template <class M>
  explicit ShardedUnitImpl(std::shared_ptr<M> inner)
      : ShardedUnitImpl(torch::nn::AnyModule(std::move(inner))) {}
  /// A Sequential's child (or any type-erased module).
  explicit ShardedUnitImpl(torch::nn::AnyModule inner);

  /// inner->forward(x) with the unit's parameters gathered.
  at::Tensor forward(const at::Tensor& x);
  /// f() (returning a tensor) with the unit's parameters gathered: any
  /// other signature, e.g. unit->call([&] { return block->forward(x, mask); }).
  template <class F>
  at::Tensor call(F&& f) {
    enter();
    at::Tensor out = std::forward<F>(f)();
    leave(out);
    return out;
  }

  /// The wrapped module.
  const std::shared_ptr<torch::nn::Module>& inner() const { return inner_; }
  /// The optimizer's link (make_optimizer sets it; tests read it).
  const std::shared_ptr<UnitSlot>& slot() const { return slot_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  void enter();
  void leave(const at::Tensor& out);

  std::shared_ptr<torch::nn::Module> inner_;
  torch::nn::AnyModule any_;
  std::shared_ptr<UnitSlot> slot_ = std::make_shared<UnitSlot>();
};
TORCH_MODULE(ShardedUnit);

/// A Sequential whose every child is wrapped in a ShardedUnit (children that
/// already are units stay as they are), names kept: the default unit policy
/// for a model written as a Sequential.
torch::nn::Sequential shard_units(const torch::nn::Sequential& seq);

}  // namespace distopt
