// Option schemas of the inner optimizers (the `optimizer:` section), shared by
// the host (validation) and the SDK's optimizer factory (construction) so the
// two can never disagree. Torch-free.
#pragma once

#include <cstring>

#include "distopt/abi.h"
#include "distopt/sdk/base/options.hpp"

namespace distopt::sdk {

namespace detail {
// [0, inf) and [0, 1) (Adam's betas: 1 would divide by 1 - beta^t = 0).
constexpr OptionDecl nonneg(const char* name, const char* def, const char* help) {
  return option_double(name, def, help).at_least(0);
}
constexpr OptionDecl beta(const char* name, const char* def, const char* help) {
  return option_double(name, def, help).range_open_max(0, 1);
}
inline constexpr dopt_option_spec kSgd[] = {
    nonneg("lr", "0.01", "learning rate"),
    nonneg("momentum", "0", "momentum factor"),
    option_double("dampening", "0", "dampening for momentum").range(0, 1),
    nonneg("weight_decay", "0", "L2 penalty"),
    option_bool("nesterov", "false", "Nesterov momentum (needs momentum > 0, dampening 0)"),
};
inline constexpr dopt_option_spec kAdam[] = {
    nonneg("lr", "0.001", "learning rate"),
    beta("beta1", "0.9", "first-moment decay"),
    beta("beta2", "0.999", "second-moment decay"),
    nonneg("eps", "1e-8", "denominator epsilon"),
    nonneg("weight_decay", "0", "L2 penalty (adam) / decoupled decay (adamw)"),
    option_bool("amsgrad", "false", "AMSGrad variant"),
};
inline constexpr dopt_option_spec kAdamW[] = {
    nonneg("lr", "0.001", "learning rate"),
    beta("beta1", "0.9", "first-moment decay"),
    beta("beta2", "0.999", "second-moment decay"),
    nonneg("eps", "1e-8", "denominator epsilon"),
    nonneg("weight_decay", "0.01", "decoupled weight decay"),
    option_bool("amsgrad", "false", "AMSGrad variant"),
};
inline constexpr dopt_option_spec kAdagrad[] = {
    nonneg("lr", "0.01", "learning rate"),
    nonneg("lr_decay", "0", "learning-rate decay"),
    nonneg("weight_decay", "0", "L2 penalty"),
    nonneg("initial_accumulator_value", "0", "initial sum of squares"),
    nonneg("eps", "1e-10", "denominator epsilon"),
};
inline constexpr dopt_option_spec kRmsprop[] = {
    nonneg("lr", "0.01", "learning rate"),
    option_double("alpha", "0.99", "smoothing constant").range(0, 1),
    nonneg("eps", "1e-8", "denominator epsilon"),
    nonneg("weight_decay", "0", "L2 penalty"),
    nonneg("momentum", "0", "momentum factor"),
    option_bool("centered", "false", "normalise by an estimate of the variance"),
};
}  // namespace detail

/// Names of the supported inner optimizers, '|'-separated.
inline constexpr const char* kOptimizerNames = "sgd|adam|adamw|adagrad|rmsprop";

/// The schema of optimizer `name` (options other than `name`); *n gets the
/// count. Returns nullptr for an unknown name.
inline const dopt_option_spec* optimizer_schema(const char* name, size_t* n) {
  using namespace detail;
#define DOPT_SCHEMA_CASE(STR, ARR)     \
  if (std::strcmp(name, STR) == 0) {   \
    *n = sizeof(ARR) / sizeof(ARR[0]); \
    return ARR;                        \
  }
  DOPT_SCHEMA_CASE("sgd", kSgd)
  DOPT_SCHEMA_CASE("adam", kAdam)
  DOPT_SCHEMA_CASE("adamw", kAdamW)
  DOPT_SCHEMA_CASE("adagrad", kAdagrad)
  DOPT_SCHEMA_CASE("rmsprop", kRmsprop)
#undef DOPT_SCHEMA_CASE
  *n = 0;
  return nullptr;
}

}  // namespace distopt::sdk
