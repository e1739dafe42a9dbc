// Forwarding header: moved to distopt/sdk/transport/p2p_transport.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/p2p_transport.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/transport/p2p_transport.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/transport/p2p_transport.hpp"
