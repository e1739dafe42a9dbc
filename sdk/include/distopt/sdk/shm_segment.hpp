// Forwarding header: moved to distopt/sdk/transport/shm_segment.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/transport/shm_segment.hpp"
