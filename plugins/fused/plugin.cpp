// ABI glue of the `fused` plugin (Bagua's fuse_optimizer; see
// fused_algorithm.hpp for the layout and what each option does).
#include "fused_algorithm.hpp"

namespace {
constexpr dopt_option_spec kOptions[] = {
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "do_flatten", DOPT_OPTION_BOOL, "true", 0, -1, nullptr,
     "true: one flat optimizer-state buffer and ONE fused update pass per parameter group (Bagua "
     "fuse_optimizer do_flatten); false: fuse only runs of parameters already contiguous in "
     "memory"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "check_flatten", DOPT_OPTION_BOOL, "true", 0, -1,
     nullptr,
     "before each step verify every parameter still has the memory it had when flattened; a "
     "replaced .data is re-flattened (warning, state kept), a changed size is an error"},
};
}  // namespace

DOPT_PLUGIN("fused", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::FusedAlgorithm, "fused", "1.0.0",
                           "fused inner optimizer (sgd/adam/adamw): reduce buckets, then one "
                           "single-pass update per parameter group (Bagua fuse_optimizer)",
                           kOptions))
