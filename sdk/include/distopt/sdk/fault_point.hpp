// Forwarding header: moved to distopt/sdk/base/fault_point.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/fault_point.hpp"
