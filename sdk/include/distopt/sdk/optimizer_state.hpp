// Forwarding header: moved to distopt/sdk/optim/optimizer_state.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/optim/optimizer_state.hpp"
