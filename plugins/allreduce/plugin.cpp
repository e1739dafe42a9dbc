// ABI glue of the `allreduce` plugin.
#include <limits>

#include "allreduce_algorithm.hpp"

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr dopt_option_spec kOptions[] = {
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "grad_clip", DOPT_OPTION_DOUBLE, "0", 0, kInf, nullptr,
     "max global L2 norm of the reduced gradients (0 = no clipping)"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "average_world", DOPT_OPTION_BOOL, "true", 0, -1,
     nullptr, "true: gradients are averaged over ranks; false: summed"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "divide_before", DOPT_OPTION_BOOL, "false", 0, -1,
     nullptr,
     "divide local gradients by the world size before the reducer (keeps low-precision sums in "
     "range)"},
};
}  // namespace

DOPT_PLUGIN(
    "allreduce", "1.0.0",
    DOPT_COMPONENT(
        distopt::plugins::AllreduceAlgorithm, "allreduce", "1.0.0",
        "centralized data parallel: reduce every bucket, then any inner optimizer on every rank",
        kOptions))
