// Everything torch-free a plugin author needs: errors and the exception
// barrier, host services, options, requests, communicator/reducer views, base
// classes and DOPT_PLUGIN, the p2p communicator shell (a transport plus a few
// lines is a communicator). Torch users add distopt/sdk/tensor.hpp and
// distopt/sdk/optimizer_factory.hpp.
#pragma once

#include "distopt/sdk/comm.hpp"
#include "distopt/sdk/host.hpp"
#include "distopt/sdk/inner_reducer.hpp"
#include "distopt/sdk/local_state.hpp"
#include "distopt/sdk/options.hpp"
#include "distopt/sdk/p2p_communicator.hpp"
#include "distopt/sdk/plugin.hpp"
#include "distopt/sdk/request.hpp"
#include "distopt/sdk/serial_worker.hpp"
#include "distopt/sdk/traffic.hpp"
