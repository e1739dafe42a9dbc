// Forwarding header: moved to distopt/sdk/collective/shm_collectives.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/shm_collectives.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/collective/shm_collectives.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/collective/shm_collectives.hpp"
