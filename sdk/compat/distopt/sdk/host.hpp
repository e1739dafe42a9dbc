// Forwarding header: moved to distopt/sdk/base/host.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/host.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/host.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/host.hpp"
