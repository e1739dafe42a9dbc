// Forwarding header: moved to distopt/sdk/transport/socket_io.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/transport/socket_io.hpp"
