// Forwarding header: moved to distopt/sdk/optim/whole_params.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/optim/whole_params.hpp"
