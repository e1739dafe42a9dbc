// Forwarding header: moved to distopt/sdk/optim/grad_clip.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/optim/grad_clip.hpp"
