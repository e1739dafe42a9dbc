// Forwarding header: moved to distopt/sdk/base/request.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/request.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/request.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/request.hpp"
