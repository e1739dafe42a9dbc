// Forwarding header: moved to distopt/sdk/optim/local_state.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/optim/local_state.hpp"
