// ABI glue of the `allreduce` plugin.
#include "allreduce_algorithm.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_double("grad_clip", "0",
                       "max global L2 norm of the reduced gradients (0 = no clipping)")
        .at_least(0),
    sdk::option_bool("average_world", "true",
                     "true: gradients are averaged over ranks; false: summed"),
    sdk::option_bool("divide_before", "false",
                     "divide local gradients by the world size before the reducer (keeps "
                     "low-precision sums in range)"),
};
}  // namespace

DOPT_PLUGIN(
    "allreduce", "1.0.0",
    DOPT_COMPONENT(
        distopt::plugins::allreduce::AllreduceAlgorithm, "allreduce", "1.0.0",
        "centralized data parallel: reduce every bucket, then any inner optimizer on every rank",
        kOptions))
