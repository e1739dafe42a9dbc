// Forwarding header: moved to distopt/sdk/transport/shm_segment.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/shm_segment.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/transport/shm_segment.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/transport/shm_segment.hpp"
