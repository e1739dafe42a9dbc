// Option schemas of the inner optimizers (the `optimizer:` section), shared by
// the host (validation) and the SDK's optimizer factory (construction) so the
// two can never disagree. Torch-free.
#pragma once

#include <cstring>
#include <limits>

#include "distopt/abi.h"

namespace distopt::sdk {

namespace detail {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr dopt_option_spec opt(const char* name, dopt_option_type type, const char* def, double lo,
                               double hi, const char* help) {
  return dopt_option_spec{
      DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, name, type, def, lo, hi, nullptr, help};
}
inline constexpr dopt_option_spec kSgd[] = {
    opt("lr", DOPT_OPTION_DOUBLE, "0.01", 0, kInf, "learning rate"),
    opt("momentum", DOPT_OPTION_DOUBLE, "0", 0, kInf, "momentum factor"),
    opt("dampening", DOPT_OPTION_DOUBLE, "0", 0, 1, "dampening for momentum"),
    opt("weight_decay", DOPT_OPTION_DOUBLE, "0", 0, kInf, "L2 penalty"),
    opt("nesterov", DOPT_OPTION_BOOL, "false", 0, -1,
        "Nesterov momentum (needs momentum > 0, dampening 0)"),
};
inline constexpr dopt_option_spec kAdam[] = {
    opt("lr", DOPT_OPTION_DOUBLE, "0.001", 0, kInf, "learning rate"),
    opt("beta1", DOPT_OPTION_DOUBLE, "0.9", 0, 1, "first-moment decay"),
    opt("beta2", DOPT_OPTION_DOUBLE, "0.999", 0, 1, "second-moment decay"),
    opt("eps", DOPT_OPTION_DOUBLE, "1e-8", 0, kInf, "denominator epsilon"),
    opt("weight_decay", DOPT_OPTION_DOUBLE, "0", 0, kInf,
        "L2 penalty (adam) / decoupled decay (adamw)"),
    opt("amsgrad", DOPT_OPTION_BOOL, "false", 0, -1, "AMSGrad variant"),
};
inline constexpr dopt_option_spec kAdamW[] = {
    opt("lr", DOPT_OPTION_DOUBLE, "0.001", 0, kInf, "learning rate"),
    opt("beta1", DOPT_OPTION_DOUBLE, "0.9", 0, 1, "first-moment decay"),
    opt("beta2", DOPT_OPTION_DOUBLE, "0.999", 0, 1, "second-moment decay"),
    opt("eps", DOPT_OPTION_DOUBLE, "1e-8", 0, kInf, "denominator epsilon"),
    opt("weight_decay", DOPT_OPTION_DOUBLE, "0.01", 0, kInf, "decoupled weight decay"),
    opt("amsgrad", DOPT_OPTION_BOOL, "false", 0, -1, "AMSGrad variant"),
};
inline constexpr dopt_option_spec kAdagrad[] = {
    opt("lr", DOPT_OPTION_DOUBLE, "0.01", 0, kInf, "learning rate"),
    opt("lr_decay", DOPT_OPTION_DOUBLE, "0", 0, kInf, "learning-rate decay"),
    opt("weight_decay", DOPT_OPTION_DOUBLE, "0", 0, kInf, "L2 penalty"),
    opt("initial_accumulator_value", DOPT_OPTION_DOUBLE, "0", 0, kInf, "initial sum of squares"),
    opt("eps", DOPT_OPTION_DOUBLE, "1e-10", 0, kInf, "denominator epsilon"),
};
inline constexpr dopt_option_spec kRmsprop[] = {
    opt("lr", DOPT_OPTION_DOUBLE, "0.01", 0, kInf, "learning rate"),
    opt("alpha", DOPT_OPTION_DOUBLE, "0.99", 0, 1, "smoothing constant"),
    opt("eps", DOPT_OPTION_DOUBLE, "1e-8", 0, kInf, "denominator epsilon"),
    opt("weight_decay", DOPT_OPTION_DOUBLE, "0", 0, kInf, "L2 penalty"),
    opt("momentum", DOPT_OPTION_DOUBLE, "0", 0, kInf, "momentum factor"),
    opt("centered", DOPT_OPTION_BOOL, "false", 0, -1, "normalise by an estimate of the variance"),
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
