// Forwarding header: moved to distopt/sdk/collective/p2p_communicator.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/collective/p2p_communicator.hpp"
