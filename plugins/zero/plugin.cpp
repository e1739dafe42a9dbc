// ABI glue of the `zero` plugin (ZeRO stages 1 and 2; see zero_algorithm.hpp).
#include "zero_algorithm.hpp"

namespace {
constexpr dopt_option_spec kOptions[] = {
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "stage", DOPT_OPTION_INT, "1", 1, 2, nullptr,
     "1: optimizer state sharded (gradients averaged by the reducer); 2: gradients "
     "reduce-scattered into each rank's shard during backward too"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "partition", DOPT_OPTION_STRING, "greedy", 0, -1,
     "greedy|contiguous",
     "stage 1: greedy = PyTorch ZeroRedundancyOptimizer's sorted-greedy over whole parameters; "
     "contiguous = the flat parameter space cut into W equal ranges (stage 2 always cuts each "
     "bucket into W equal ranges)"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "parameters_as_bucket_view", DOPT_OPTION_BOOL, "false",
     0, -1, nullptr,
     "sync updated parameters with one allgather of each rank's packed parameters (per bucket "
     "in stage 2) instead of one broadcast per parameter slice"},
};
}  // namespace

DOPT_PLUGIN("zero", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::zero::ZeroAlgorithm, "zero", "1.0.0",
                           "ZeRO stages 1-2: optimizer state (and gradients) sharded over ranks",
                           kOptions))
