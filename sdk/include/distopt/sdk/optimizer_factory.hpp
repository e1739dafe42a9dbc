// Forwarding header: moved to distopt/sdk/optim/optimizer_factory.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/optim/optimizer_factory.hpp"
