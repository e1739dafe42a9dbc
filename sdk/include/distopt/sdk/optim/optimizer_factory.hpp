// The inner optimizer every algorithm shares: one of libtorch's sgd, adam,
// adamw, adagrad, rmsprop, built from the `optimizer:` section (its options
// validated by the host against optimizer_schema.hpp) and parameter groups.
#pragma once

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/options.hpp"
#include "distopt/sdk/optim/optimizer_schema.hpp"

namespace distopt::sdk {

/// One parameter group: tensors whose .grad the optimizer reads (leaf tensors;
/// for the host's memory use as_tensor() and set mutable_grad() to the
/// gradient view), and overrides (negative = the optimizer's option).
struct ParamGroupInput {
  std::vector<at::Tensor> params;
  double lr = -1;
  double weight_decay = -1;
};

namespace detail {
template <class Opt, class Options>
std::unique_ptr<torch::optim::Optimizer> build_optimizer(
    const Options& defaults, const std::vector<ParamGroupInput>& groups) {
  std::vector<torch::optim::OptimizerParamGroup> pgs;
  for (const auto& g : groups) {
    auto o = std::make_unique<Options>(defaults);
    if (g.lr >= 0) o->lr(g.lr);
    if (g.weight_decay >= 0) o->weight_decay(g.weight_decay);
    pgs.emplace_back(g.params, std::move(o));
  }
  return std::make_unique<Opt>(std::move(pgs), defaults);
}
}  // namespace detail

/// Build optimizer `name` ("sgd", "adam", "adamw", "adagrad", "rmsprop"; see
/// kOptimizerNames) with options read through `opts` (keys of
/// optimizer_schema(name)) over `groups` (group i of the result is groups[i];
/// a group may be empty). Throws sdk::Error(INVALID_ARGUMENT) for an unknown
/// name or an inconsistent combination (nesterov without momentum or with
/// dampening), naming it.
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, const OptionsView& opts, const std::vector<ParamGroupInput>& groups) {
  for (const auto& g : groups) {
    if ((g.lr >= 0 && !std::isfinite(g.lr)) ||
        (g.weight_decay >= 0 && !std::isfinite(g.weight_decay)))
      throw Error(DOPT_ERR_INVALID_ARGUMENT, "parameter group lr / weight_decay must be finite");
  }
  if (name == "sgd") {
    torch::optim::SGDOptions o(opts.get_double("lr"));
    o.momentum(opts.get_double("momentum"))
        .dampening(opts.get_double("dampening"))
        .weight_decay(opts.get_double("weight_decay"))
        .nesterov(opts.get_bool("nesterov"));
    if (o.nesterov() && (o.momentum() <= 0 || o.dampening() != 0))
      throw Error(DOPT_ERR_INVALID_ARGUMENT,
                  "optimizer sgd: nesterov needs momentum > 0 and dampening 0");
    return detail::build_optimizer<torch::optim::SGD>(o, groups);
  }
  if (name == "adam" || name == "adamw") {
    auto fill = [&](auto& o) {
      o.lr(opts.get_double("lr"))
          .betas(std::make_tuple(opts.get_double("beta1"), opts.get_double("beta2")))
          .eps(opts.get_double("eps"))
          .weight_decay(opts.get_double("weight_decay"))
          .amsgrad(opts.get_bool("amsgrad"));
    };
    if (name == "adam") {
      torch::optim::AdamOptions o;
      fill(o);
      return detail::build_optimizer<torch::optim::Adam>(o, groups);
    }
    torch::optim::AdamWOptions o;
    fill(o);
    return detail::build_optimizer<torch::optim::AdamW>(o, groups);
  }
  if (name == "adagrad") {
    torch::optim::AdagradOptions o(opts.get_double("lr"));
    o.lr_decay(opts.get_double("lr_decay"))
        .weight_decay(opts.get_double("weight_decay"))
        .initial_accumulator_value(opts.get_double("initial_accumulator_value"))
        .eps(opts.get_double("eps"));
    return detail::build_optimizer<torch::optim::Adagrad>(o, groups);
  }
  if (name == "rmsprop") {
    torch::optim::RMSpropOptions o(opts.get_double("lr"));
    o.alpha(opts.get_double("alpha"))
        .eps(opts.get_double("eps"))
        .weight_decay(opts.get_double("weight_decay"))
        .momentum(opts.get_double("momentum"))
        .centered(opts.get_bool("centered"));
    return detail::build_optimizer<torch::optim::RMSprop>(o, groups);
  }
  throw Error(DOPT_ERR_INVALID_ARGUMENT,
              "unknown optimizer '" + name + "' (valid: " + std::string(kOptimizerNames) + ")");
}

/// Set the learning rate of param group `group`; throws INVALID_ARGUMENT for a
/// group out of range or a negative / non-finite lr.
inline void set_group_lr(torch::optim::Optimizer& opt, size_t group, double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error(DOPT_ERR_INVALID_ARGUMENT, "lr must be finite and >= 0");
  if (group >= opt.param_groups().size())
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                "param group " + std::to_string(group) + " out of range (" +
                    std::to_string(opt.param_groups().size()) + " groups)");
  opt.param_groups()[group].options().set_lr(lr);
}

/// Bytes held by the optimizer's per-parameter state tensors (momentum
/// buffers, Adam moments, Adagrad sums, RMSprop averages). Step counters are
/// not counted. 0 before the first step (state is created lazily).
inline uint64_t optimizer_state_bytes(const torch::optim::Optimizer& opt) {
  auto bytes = [](const at::Tensor& t) -> uint64_t {
    return t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
  };
  uint64_t total = 0;
  for (const auto& kv : opt.state()) {
    const torch::optim::OptimizerParamState* s = kv.second.get();
    if (auto* p = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      total += bytes(p->momentum_buffer());
    } else if (auto* p = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      total += bytes(p->exp_avg()) + bytes(p->exp_avg_sq()) + bytes(p->max_exp_avg_sq());
    } else if (auto* p = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      total += bytes(p->exp_avg()) + bytes(p->exp_avg_sq()) + bytes(p->max_exp_avg_sq());
    } else if (auto* p = dynamic_cast<const torch::optim::AdagradParamState*>(s)) {
      total += bytes(p->sum());
    } else if (auto* p = dynamic_cast<const torch::optim::RMSpropParamState*>(s)) {
      total += bytes(p->square_avg()) + bytes(p->momentum_buffer()) + bytes(p->grad_avg());
    }
  }
  return total;
}

}  // namespace distopt::sdk
