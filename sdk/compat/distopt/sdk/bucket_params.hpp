// Forwarding header: moved to distopt/sdk/optim/bucket_params.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/bucket_params.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/optim/bucket_params.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/optim/bucket_params.hpp"
