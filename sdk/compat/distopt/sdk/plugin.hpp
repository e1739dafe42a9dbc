// Forwarding header: moved to distopt/sdk/base/plugin.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/plugin.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/plugin.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/plugin.hpp"
