// Forwarding header: moved to distopt/sdk/optim/local_state.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/local_state.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/optim/local_state.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/optim/local_state.hpp"
