// Forwarding header: moved to distopt/sdk/collective/shm_collectives.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/collective/shm_collectives.hpp"
