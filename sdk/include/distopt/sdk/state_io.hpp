// Forwarding header: moved to distopt/sdk/base/state_io.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/state_io.hpp"
