// Checkpointing the inner optimizer (optimizer_factory.hpp) through the ABI
// 1.1 state writer / reader, under the keys state.h names:
//   optimizer/<param name>/<field>   (libtorch's field names)
// Each tensor the optimizer steps may be a slice of a model parameter (ZeRO's
// shards, a flat fused buffer's range): its state is put as that element
// range of the parameter's logical tensor, so a checkpoint reads back under
// any other partition, world size or algorithm. Step counters are put by
// every owner of a slice (equal values). Not thread-safe.
#pragma once

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "distopt/sdk/base/tensor_state.hpp"

namespace distopt::sdk {

/// Where one tensor the optimizer steps lies in a model parameter.
struct ParamSlice {
  std::string name;            ///< the model parameter's name ("fc1.weight")
  int64_t offset = 0;          ///< first element of the stepped tensor in the parameter
  std::vector<int64_t> shape;  ///< the model parameter's shape
};

/// The state key of `field` of model parameter `param`: "optimizer/<param>/<field>".
inline std::string optimizer_state_key(const std::string& param, const char* field) {
  return "optimizer/" + param + "/" + field;
}

/// Every field name a supported optimizer saves (state.h's list).
constexpr const char* kOptimizerStateFields[] = {"step",       "momentum_buffer", "exp_avg",
                                                 "exp_avg_sq", "max_exp_avg_sq",  "sum",
                                                 "square_avg", "grad_avg"};

/// For a load that found no `expected` field of parameter `param`: a
/// parameter that was never stepped has no fields at all (fine: it gets no
/// state), but one with another field was saved by another optimizer (sgd's
/// momentum_buffer read by adam). Then throws sdk::Error(INVALID_ARGUMENT)
/// naming the missing key and the one that is there, so a mismatched
/// checkpoint never loads silently as a fresh state.
inline void check_no_foreign_state(const StateReader& r, const std::string& param,
                                   const char* expected, const std::string& optimizer) {
  for (const char* f : kOptimizerStateFields) {
    if (std::string(f) == expected || !r.find(optimizer_state_key(param, f))) continue;
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                "checkpoint has no state '" + optimizer_state_key(param, expected) +
                    "' for optimizer " + optimizer + " but has '" + optimizer_state_key(param, f) +
                    "': it was saved with another optimizer");
  }
}

namespace detail {

inline std::string opt_key(const ParamSlice& s, const char* field) {
  return optimizer_state_key(s.name, field);
}

inline void put_field(StateWriter& w, const ParamSlice& s, const char* field, const at::Tensor& t) {
  if (t.defined()) put_sharded(w, opt_key(s, field), t.reshape({-1}), s.offset, s.shape);
}
inline void put_step(StateWriter& w, const ParamSlice& s, int64_t step) {
  put_sharded(w, opt_key(s, "step"), at::full({1}, step, at::kLong), 0, {});
}
inline at::Tensor read_field(const StateReader& r, const ParamSlice& s, const char* field,
                             const at::Tensor& like) {
  at::Tensor t = at::empty_like(like, at::MemoryFormat::Contiguous);
  read_into(r, opt_key(s, field), s.offset, t);
  return t;
}
inline int64_t read_step(const StateReader& r, const ParamSlice& s) {
  return read_range(r, opt_key(s, "step"), 0, 1, at::kLong).item<int64_t>();
}

template <class F>
void for_each_param(const torch::optim::Optimizer& opt,
                    const std::vector<std::vector<ParamSlice>>& slices, F&& f) {
  const auto& groups = opt.param_groups();
  if (slices.size() != groups.size())
    throw Error(DOPT_ERR_INTERNAL, "optimizer state: " + std::to_string(slices.size()) +
                                       " slice lists for " + std::to_string(groups.size()) +
                                       " param groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& ps = groups[g].params();
    if (slices[g].size() != ps.size())
      throw Error(DOPT_ERR_INTERNAL, "optimizer state: group " + std::to_string(g) + " has " +
                                         std::to_string(ps.size()) + " tensors but " +
                                         std::to_string(slices[g].size()) + " slices");
    for (size_t i = 0; i < ps.size(); ++i) f(ps[i], slices[g][i]);
  }
}

// libtorch keys optimizer state by the parameter's TensorImpl: as a string
// in 1.x, as the pointer itself in 2.x. Either way, the key of `p`.
using StateMap =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename StateMap::key_type;
template <typename Key = StateKey>  // a template, so only the taken branch is compiled
Key state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // what 1.x's c10::guts::to_string(TensorImpl*) writes
    os << static_cast<const void*>(p.unsafeGetTensorImpl());
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace detail

/// Put the state of every tensor `opt` steps; slices[g][i] describes
/// opt.param_groups()[g].params()[i]. Tensors without state yet (never
/// stepped) put nothing. Throws sdk::Error for an optimizer type the factory
/// does not build.
inline void save_optimizer_state(const torch::optim::Optimizer& opt,
                                 const std::vector<std::vector<ParamSlice>>& slices,
                                 StateWriter& w) {
  using namespace torch::optim;
  detail::for_each_param(opt, slices, [&](const at::Tensor& p, const ParamSlice& s) {
    auto it = opt.state().find(detail::state_key(p));
    if (it == opt.state().end()) return;
    const OptimizerParamState* st = it->second.get();
    if (auto* q = dynamic_cast<const SGDParamState*>(st)) {
      detail::put_field(w, s, "momentum_buffer", q->momentum_buffer());
    } else if (auto* q = dynamic_cast<const AdamParamState*>(st)) {
      detail::put_step(w, s, q->step());
      detail::put_field(w, s, "exp_avg", q->exp_avg());
      detail::put_field(w, s, "exp_avg_sq", q->exp_avg_sq());
      detail::put_field(w, s, "max_exp_avg_sq", q->max_exp_avg_sq());
    } else if (auto* q = dynamic_cast<const AdamWParamState*>(st)) {
      detail::put_step(w, s, q->step());
      detail::put_field(w, s, "exp_avg", q->exp_avg());
      detail::put_field(w, s, "exp_avg_sq", q->exp_avg_sq());
      detail::put_field(w, s, "max_exp_avg_sq", q->max_exp_avg_sq());
    } else if (auto* q = dynamic_cast<const AdagradParamState*>(st)) {
      detail::put_step(w, s, q->step());
      detail::put_field(w, s, "sum", q->sum());
    } else if (auto* q = dynamic_cast<const RMSpropParamState*>(st)) {
      detail::put_step(w, s, q->step());
      detail::put_field(w, s, "square_avg", q->square_avg());
      detail::put_field(w, s, "momentum_buffer", q->momentum_buffer());
      detail::put_field(w, s, "grad_avg", q->grad_avg());
    } else {
      throw Error(DOPT_ERR_UNSUPPORTED, "optimizer state of an unknown optimizer type");
    }
  });
}

/// Replace the state of every tensor `opt` steps with what `r` holds for its
/// slice (slices as for save_optimizer_state). A parameter the checkpoint
/// has no state for (never stepped) is left without state, as in a fresh
/// optimizer. Throws sdk::Error(INVALID_ARGUMENT) naming the key when the
/// checkpoint holds another optimizer's state (e.g. sgd loaded into adam:
/// see check_no_foreign_state) or lacks a field the options need (amsgrad's
/// max_exp_avg_sq). Adam and AdamW state are interchangeable (same fields).
inline void load_optimizer_state(torch::optim::Optimizer& opt,
                                 const std::vector<std::vector<ParamSlice>>& slices,
                                 const StateReader& r) {
  using namespace torch::optim;
  // The expected fields follow the optimizer's options, so a mismatched
  // checkpoint fails on a named key instead of loading half a state.
  auto amsgrad = [&](const OptimizerParamGroup& g) {
    if (auto* o = dynamic_cast<const AdamOptions*>(&g.options())) return o->amsgrad();
    if (auto* o = dynamic_cast<const AdamWOptions*>(&g.options())) return o->amsgrad();
    return false;
  };
  const bool is_sgd = dynamic_cast<SGD*>(&opt) != nullptr;
  const bool is_adam = dynamic_cast<Adam*>(&opt) != nullptr;
  const bool is_adamw = dynamic_cast<AdamW*>(&opt) != nullptr;
  const bool is_adagrad = dynamic_cast<Adagrad*>(&opt) != nullptr;
  const bool is_rmsprop = dynamic_cast<RMSprop*>(&opt) != nullptr;
  if (!(is_sgd || is_adam || is_adamw || is_adagrad || is_rmsprop))
    throw Error(DOPT_ERR_UNSUPPORTED, "optimizer state of an unknown optimizer type");

  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& group = opt.param_groups()[g];
    if (slices.size() != opt.param_groups().size() || slices[g].size() != group.params().size())
      throw Error(DOPT_ERR_INTERNAL, "optimizer state: slices do not match the param groups");
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const ParamSlice& s = slices[g][i];
      const auto key = detail::state_key(p);
      if (is_sgd) {
        // SGD saves no step: one in the checkpoint means another optimizer
        // (rmsprop's momentum_buffer would otherwise load as SGD momentum).
        if (r.find(detail::opt_key(s, "step")))
          throw Error(DOPT_ERR_INVALID_ARGUMENT,
                      "checkpoint has state '" + detail::opt_key(s, "step") +
                          "', which optimizer sgd does not keep: it was saved with another "
                          "optimizer");
        if (!r.find(detail::opt_key(s, "momentum_buffer"))) {
          check_no_foreign_state(r, s.name, "momentum_buffer", "sgd");
          opt.state().erase(key);
          continue;
        }
        auto st = std::make_unique<SGDParamState>();
        st->momentum_buffer(detail::read_field(r, s, "momentum_buffer", p));
        opt.state()[key] = std::move(st);
        continue;
      }
      if (!r.find(detail::opt_key(s, "step"))) {
        const char* name = is_adam      ? "adam"
                           : is_adamw   ? "adamw"
                           : is_adagrad ? "adagrad"
                                        : "rmsprop";
        check_no_foreign_state(r, s.name, "step", name);
        // libtorch's Adagrad creates its state in the constructor, so every
        // Adagrad checkpoint has a step for every parameter.
        if (is_adagrad)
          throw Error(DOPT_ERR_INVALID_ARGUMENT,
                      "checkpoint has no state '" + detail::opt_key(s, "step") + "' (adagrad)");
        opt.state().erase(key);
        continue;
      }
      const int64_t step = detail::read_step(r, s);
      if (is_adam || is_adamw) {
        auto fill = [&](auto st) {
          st->step(step);
          st->exp_avg(detail::read_field(r, s, "exp_avg", p));
          st->exp_avg_sq(detail::read_field(r, s, "exp_avg_sq", p));
          if (amsgrad(group)) st->max_exp_avg_sq(detail::read_field(r, s, "max_exp_avg_sq", p));
          opt.state()[key] = std::move(st);
        };
        if (is_adam)
          fill(std::make_unique<AdamParamState>());
        else
          fill(std::make_unique<AdamWParamState>());
      } else if (is_adagrad) {
        auto st = std::make_unique<AdagradParamState>();
        st->step(step);
        st->sum(detail::read_field(r, s, "sum", p));
        opt.state()[key] = std::move(st);
      } else {
        const auto& o = static_cast<const RMSpropOptions&>(group.options());
        auto st = std::make_unique<RMSpropParamState>();
        st->step(step);
        st->square_avg(detail::read_field(r, s, "square_avg", p));
        if (o.momentum() > 0) st->momentum_buffer(detail::read_field(r, s, "momentum_buffer", p));
        if (o.centered()) st->grad_avg(detail::read_field(r, s, "grad_avg", p));
        opt.state()[key] = std::move(st);
      }
    }
  }
}

/// Make `opt` step `fresh` in place of opt.param_groups()[group].params()[index]
/// (a parameter the host re-pointed: torch::load, set_data), keeping that
/// tensor's optimizer state and gradient. `fresh` must have the same shape
/// and dtype. Throws sdk::Error(INTERNAL) for an index out of range.
inline void replace_param(torch::optim::Optimizer& opt, size_t group, size_t index,
                          at::Tensor fresh) {
  if (group >= opt.param_groups().size() || index >= opt.param_groups()[group].params().size())
    throw Error(DOPT_ERR_INTERNAL, "replace_param: no tensor " + std::to_string(index) +
                                       " in param group " + std::to_string(group));
  at::Tensor& old = opt.param_groups()[group].params()[index];
  fresh.mutable_grad() = old.grad();
  auto it = opt.state().find(detail::state_key(old));
  if (it != opt.state().end()) {
    auto st = std::move(it->second);
    opt.state().erase(it);
    opt.state()[detail::state_key(fresh)] = std::move(st);
  }
  old = std::move(fresh);
}

}  // namespace distopt::sdk
