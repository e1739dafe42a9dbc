// Private: the host's services below the ABI host table (the public
// distopt/host_services.hpp: logger, job metrics, error sink, status
// checking) and the one the core alone uses, set_last_error. Layers below
// registry/ (which builds the dopt_host_api table over these) include this,
// not distopt/host_api.hpp.
#pragma once

#include <string>

#include "distopt/host_services.hpp"

namespace distopt {

/// Set the calling thread's error sink (dopt_host_api::set_error; a wrapper
/// communicator's own refusal). take_last_error reads and clears it.
void set_last_error(std::string msg);

}  // namespace distopt
