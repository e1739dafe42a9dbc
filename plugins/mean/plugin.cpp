// ABI glue of the `mean` plugin.
#include "mean_reducer.hpp"

DOPT_PLUGIN("mean", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::mean::MeanReducer, "mean", "1.0.0",
                           "average of each gradient bucket over ranks (one in-place allreduce)",
                           nullptr))
