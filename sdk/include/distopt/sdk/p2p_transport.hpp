// Forwarding header: moved to distopt/sdk/transport/p2p_transport.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/transport/p2p_transport.hpp"
