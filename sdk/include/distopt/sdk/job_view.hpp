// Forwarding header: moved to distopt/sdk/base/job_view.hpp; this path stays for 1.x.
#pragma once
#include "distopt/sdk/base/job_view.hpp"
