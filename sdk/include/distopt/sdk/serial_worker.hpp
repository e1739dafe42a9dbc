// Forwarding header: moved to distopt/sdk/base/serial_worker.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/serial_worker.hpp"
