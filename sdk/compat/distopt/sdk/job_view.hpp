// Forwarding header: moved to distopt/sdk/base/job_view.hpp; this path stays for 1.x.
#pragma once
#ifndef DISTOPT_SDK_NO_DEPRECATION_WARNING
#warning "distopt/sdk/job_view.hpp is deprecated: include distopt/sdk/sdk.hpp or distopt/sdk/base/job_view.hpp (define DISTOPT_SDK_NO_DEPRECATION_WARNING to silence)"
#endif
#include "distopt/sdk/base/job_view.hpp"
