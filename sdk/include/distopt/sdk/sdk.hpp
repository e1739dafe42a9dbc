// The plugin author's one include: everything torch-free a plugin needs, from
// the SDK's layers (DESIGN.md, "The SDK's layers"): base/ (errors and the
// exception barrier, host services, options, requests, communicator/reducer
// views, base classes and DOPT_PLUGIN), the p2p communicator shell of
// collective/ (a transport plus a few lines is a communicator) and
// optim/local_state.hpp. Torch users add distopt/sdk/base/tensor.hpp and
// distopt/sdk/optim/optimizer_factory.hpp.
#pragma once

#include "distopt/sdk/base/comm.hpp"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/inner_reducer.hpp"
#include "distopt/sdk/base/options.hpp"
#include "distopt/sdk/base/plugin.hpp"
#include "distopt/sdk/base/reducer_view.hpp"
#include "distopt/sdk/base/request.hpp"
#include "distopt/sdk/base/serial_worker.hpp"
#include "distopt/sdk/base/traffic.hpp"
#include "distopt/sdk/collective/p2p_communicator.hpp"
#include "distopt/sdk/optim/local_state.hpp"
