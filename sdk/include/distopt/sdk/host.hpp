// Forwarding header: moved to distopt/sdk/base/host.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/host.hpp"
