// Forwarding header: moved to distopt/sdk/optim/flat_shards.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/optim/flat_shards.hpp"
