// Forwarding header: moved to distopt/sdk/base/inner_reducer.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/inner_reducer.hpp"
