// Forwarding header: moved to distopt/sdk/base/tensor_state.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/tensor_state.hpp"
