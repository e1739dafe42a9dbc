// ABI glue of the `local_sgd` plugin (see local_sgd_algorithm.hpp).
#include "local_sgd_algorithm.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_int("warmup_steps", "0",
                    "steps of gradient allreduce (through the reducer, as `allreduce`) before "
                    "the local steps; 0: local from the first step")
        .at_least(0),
    sdk::option_int("period", "4",
                    "after the warm-up, average the parameters over all ranks after every "
                    "period-th local step; local steps between")
        .range(1, 1000000),
};
}  // namespace

DOPT_PLUGIN("local_sgd", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::local_sgd::LocalSgdAlgorithm, "local_sgd", "1.0.0",
                           "post-local SGD: gradient allreduce for warmup_steps, then local steps "
                           "with the parameters averaged over all ranks every period steps",
                           kOptions))
