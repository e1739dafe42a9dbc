// The inner optimizer over every trainable parameter whole, for algorithms
// whose ranks each step all parameters (allreduce: replicated;
// decentralized: per-rank replicas). Torch.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "distopt/algorithm.h"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/base/tensor_state.hpp"
#include "distopt/sdk/optim/local_state.hpp"
#include "distopt/sdk/optim/optimizer_factory.hpp"
#include "distopt/sdk/optim/optimizer_state.hpp"

namespace distopt::sdk {

/// Non-owning tensors aliasing the host's parameters (each .grad aliasing
/// its slot in a bucket, so a reduced bucket is what the optimizer reads),
/// one optimizer group per dopt_param_group (same index), and the
/// checkpoint slices of each (whole parameters). Not thread-safe.
class WholeParams {
 public:
  /// Throws sdk::Error(INVALID_ARGUMENT) naming `component` and the parameter
  /// for a group index out of range, and what make_optimizer throws.
  WholeParams(const dopt_algorithm_args& args, const std::string& component)
      : component_(component), params_(args.params) {
    std::vector<ParamGroupInput> groups(args.num_groups);
    for (size_t g = 0; g < args.num_groups; ++g) {
      groups[g].lr = args.groups[g].lr;
      groups[g].weight_decay = args.groups[g].weight_decay;
    }
    slices_.resize(args.num_groups);
    by_index_.resize(args.num_params);
    for (size_t i = 0; i < args.num_params; ++i) {
      const dopt_param& p = args.params[i];
      if (!p.requires_grad || !p.grad) continue;
      const std::string name = p.name ? p.name : "";
      if (p.group < 0 || static_cast<size_t>(p.group) >= args.num_groups)
        throw Error(DOPT_ERR_INVALID_ARGUMENT, component + ": parameter " + name + " has group " +
                                                   std::to_string(p.group) + " of " +
                                                   std::to_string(args.num_groups));
      at::Tensor t = as_tensor(*p.data);
      t.mutable_grad() = as_tensor(*p.grad);
      by_index_[i] = t;
      trainable_.emplace_back(name, t);
      groups[p.group].params.push_back(t);
      slices_[p.group].push_back(
          {name, 0, std::vector<int64_t>(t.sizes().begin(), t.sizes().end())});
    }
    optimizer_ = make_optimizer(args.optimizer_name ? args.optimizer_name : "",
                                OptionsView(args.optimizer_options), groups);
  }

  /// Per dopt_param index: the parameter, undefined when frozen.
  const std::vector<at::Tensor>& by_index() const { return by_index_; }
  /// (name, tensor) of the trainable parameters, in dopt_param order.
  const std::vector<std::pair<std::string, at::Tensor>>& trainable() const { return trainable_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  /// follow_host_params(), then one step of the inner optimizer.
  void step() {
    follow_host_params();
    optimizer_->step();
  }
  /// The host re-points a parameter's descriptor when user code moved it
  /// (torch::load into a module, set_data; algorithm.h): make the aliasing
  /// tensor point at the new memory in place (same TensorImpl, so the
  /// optimizer's groups, its state and BucketParams keep following it).
  /// Cheap when nothing moved (one pointer comparison per parameter).
  void follow_host_params() {
    for (size_t i = 0; i < by_index_.size(); ++i) {
      at::Tensor& t = by_index_[i];
      if (!t.defined()) continue;
      const DLTensor& d = *params_[i].data;
      if (t.data_ptr() == static_cast<char*>(d.data) + d.byte_offset) continue;
      at::NoGradGuard no_grad;
      t.set_(as_tensor(d));
    }
  }
  /// Throws sdk::Error(INVALID_ARGUMENT) for a group out of range.
  void set_lr(int32_t group, double lr) {
    if (group < 0 || static_cast<size_t>(group) >= slices_.size())
      throw Error(DOPT_ERR_INVALID_ARGUMENT,
                  component_ + ": no parameter group " + std::to_string(group));
    set_group_lr(*optimizer_, static_cast<size_t>(group), lr);
  }
  /// Bytes of optimizer state (momentum, Adam moments, ...).
  uint64_t state_bytes() const { return optimizer_state_bytes(*optimizer_); }
  /// The optimizer state under optimizer/<param>/<field> (state.h), whole.
  void save(StateWriter& w) const { save_optimizer_state(*optimizer_, slices_, w); }
  void load(const StateReader& r) { load_optimizer_state(*optimizer_, slices_, r); }

 private:
  std::string component_;
  const dopt_param* params_;  // the host's descriptors, stable until destroy (algorithm.h)
  std::vector<at::Tensor> by_index_;
  std::vector<std::pair<std::string, at::Tensor>> trainable_;
  std::vector<std::vector<ParamSlice>> slices_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

/// Checkpoint state of an algorithm whose ranks hold different replicas
/// (DOPT_TRAIT_LOCAL_REPLICAS: decentralized, local SGD). Every rank puts its
/// own parameters under replica/<param> and its inner optimizer's state under
/// local/optimizer/... (RANK_LOCAL), and rank 0 also puts its optimizer state
/// under the usual optimizer/... keys so that other algorithms load it.
/// Called on every rank between steps; no communicator use.
inline void save_local_replica(StateWriter& w, const WholeParams& params, int32_t rank) {
  for (const auto& [name, t] : params.trainable()) put_local(w, "replica/" + name, t);
  RankLocalWriter local(w, "local/");
  params.save(local.writer());
  if (rank == 0) params.save(w);
}

/// Restores what save_local_replica put. A checkpoint of the same world size
/// gives every rank its own replica and optimizer state back (bitwise); one of
/// another world size gives every rank the mean of the saved replicas (the
/// host's reader averages RANK_LOCAL entries) and is warned about, naming
/// `component`; one written by an algorithm without replicas leaves the parameters
/// as the host loaded them and reads its optimizer/... state. Returns whether
/// replicas were found. Throws what the reader throws.
inline bool load_local_replica(const StateReader& r, WholeParams& params, int32_t world_size,
                               const std::string& component) {
  at::NoGradGuard ng;
  bool found = false;
  for (const auto& [name, t] : params.trainable()) {
    if (!r.find("replica/" + name)) continue;
    read_into(r, "replica/" + name, 0, t);
    found = true;
  }
  PreferPrefixReader local(r, "local/");
  params.load(local.reader());
  if (found && r.saved_world_size() != world_size)
    log_warn(component.c_str(), "checkpoint of " + std::to_string(r.saved_world_size()) +
                                    " ranks loaded into " + std::to_string(world_size) +
                                    ": every rank starts from the mean of the saved replicas");
  return found;
}

}  // namespace distopt::sdk
