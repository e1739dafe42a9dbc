// Forwarding header: moved to distopt/sdk/base/fnv1a.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/fnv1a.hpp"
