// Everything torch-free a plugin author needs: errors and the exception
// barrier, host services, options, requests, communicator/reducer views, base
// classes and DOPT_PLUGIN, the p2p communicator shell (a transport plus a few
// lines is a communicator). Torch users add distopt/sdk/base/tensor.hpp and
// distopt/sdk/optim/optimizer_factory.hpp.
#pragma once

#include "distopt/sdk/base/comm.hpp"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/inner_reducer.hpp"
#include "distopt/sdk/base/options.hpp"
#include "distopt/sdk/base/plugin.hpp"
#include "distopt/sdk/base/request.hpp"
#include "distopt/sdk/base/serial_worker.hpp"
#include "distopt/sdk/base/traffic.hpp"
#include "distopt/sdk/collective/p2p_communicator.hpp"
#include "distopt/sdk/optim/local_state.hpp"
