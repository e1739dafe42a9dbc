// Forwarding header: moved to distopt/sdk/collective/store_split.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/store_split.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/collective/store_split.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/collective/store_split.hpp"
