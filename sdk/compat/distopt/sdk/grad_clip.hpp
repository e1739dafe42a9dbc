// Forwarding header: moved to distopt/sdk/optim/grad_clip.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/grad_clip.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/optim/grad_clip.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/optim/grad_clip.hpp"
