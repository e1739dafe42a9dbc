// Forwarding header: moved to distopt/sdk/transport/socket_io.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/socket_io.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/transport/socket_io.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/transport/socket_io.hpp"
