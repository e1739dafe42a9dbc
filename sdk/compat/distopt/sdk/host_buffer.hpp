// Forwarding header: moved to distopt/sdk/collective/host_buffer.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/host_buffer.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/collective/host_buffer.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/collective/host_buffer.hpp"
