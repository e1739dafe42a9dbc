// Forwarding header: moved to distopt/sdk/base/options.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/options.hpp"
