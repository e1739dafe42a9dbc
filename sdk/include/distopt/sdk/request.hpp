// Forwarding header: moved to distopt/sdk/base/request.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/request.hpp"
