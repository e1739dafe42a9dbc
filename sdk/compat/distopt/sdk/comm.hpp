// Forwarding header: moved to distopt/sdk/base/comm.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/comm.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/comm.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/comm.hpp"
