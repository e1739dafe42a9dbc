// Forwarding header: moved to distopt/sdk/collective/reduce_kernels.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/reduce_kernels.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/collective/reduce_kernels.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/collective/reduce_kernels.hpp"
