// Forwarding header: moved to distopt/sdk/base/traffic.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/traffic.hpp"
