// The host side of the plugin ABI: the dopt_host_api table, over the host's
// services (error sink, status checking, metrics, logger:
// distopt/host_services.hpp).
#pragma once

#include "distopt/abi.h"
#include "distopt/host_services.hpp"

namespace distopt {

/// The process-wide host API table passed to every plugin. Thread-safe.
const dopt_host_api* host_api();

}  // namespace distopt
