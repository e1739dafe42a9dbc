// ABI glue of the `fused` plugin (Bagua's fuse_optimizer; see
// fused_algorithm.hpp for the layout and what each option does).
#include "fused_algorithm.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_bool(
        "do_flatten", "true",
        "true: one flat optimizer-state buffer and ONE fused update pass per parameter group "
        "(Bagua fuse_optimizer do_flatten); false: fuse only runs of parameters already "
        "contiguous in memory"),
    sdk::option_bool(
        "check_flatten", "true",
        "before each step verify every parameter still has the memory it had when flattened; a "
        "replaced .data is re-flattened (warning, state kept), a changed size is an error"),
};
}  // namespace

DOPT_PLUGIN("fused", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::fused::FusedAlgorithm, "fused", "1.0.0",
                           "fused inner optimizer (sgd/adam/adamw): reduce buckets, then one "
                           "single-pass update per parameter group (Bagua fuse_optimizer)",
                           kOptions))
