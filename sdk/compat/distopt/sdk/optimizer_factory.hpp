// Forwarding header: moved to distopt/sdk/optim/optimizer_factory.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/optimizer_factory.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/optim/optimizer_factory.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/optim/optimizer_factory.hpp"
