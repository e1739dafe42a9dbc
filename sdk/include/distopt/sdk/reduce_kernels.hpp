// Forwarding header: moved to distopt/sdk/collective/reduce_kernels.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/collective/reduce_kernels.hpp"
