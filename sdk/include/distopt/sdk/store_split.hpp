// Forwarding header: moved to distopt/sdk/collective/store_split.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/collective/store_split.hpp"
