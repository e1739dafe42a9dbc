// Forwarding header: moved to distopt/sdk/base/fault_point.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/fault_point.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/fault_point.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/fault_point.hpp"
