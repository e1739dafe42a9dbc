// Forwarding header: moved to distopt/sdk/base/state_io.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/state_io.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/state_io.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/state_io.hpp"
