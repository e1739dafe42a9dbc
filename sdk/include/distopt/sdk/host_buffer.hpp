// Forwarding header: moved to distopt/sdk/collective/host_buffer.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/collective/host_buffer.hpp"
