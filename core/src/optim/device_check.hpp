// Private: the ABI 1.4 device rule for the reducer and the algorithm of an
// optimizer (distopt/device_rule.hpp): the parameters, and so their
// gradient buckets (same device), must be on a device type each of them
// declares.
#pragma once

#include "optim/optimizer_builder.hpp"

namespace distopt::optim {

/// Check every parameter of `b` against the algorithm's, the reducer's and
/// (ABI 1.3) its inner reducer's ComponentInfo::devices, before anything is
/// created. Throws ComponentError(DOPT_ERR_UNSUPPORTED) naming the
/// component ("plugin/name"), its kind, the device, what it declares and the
/// first parameter on a device it does not declare. Local (no collective):
/// every rank of an SPMD job refuses alike.
void check_param_devices(const OptimizerBuild& b);

}  // namespace distopt::optim
