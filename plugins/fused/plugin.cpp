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
    sdk::option_string(
        "kernels", "auto",
        "update code: host (one parallel CPU loop per group; CPU parameters only), torch "
        "(libtorch multi-tensor ops: PyTorch's _fused_adam_/_fused_sgd_ from libtorch 2.4, "
        "_foreach_ ops before; any device), auto (host on CPU, torch elsewhere)")
        .choices("auto|host|torch"),
};
}  // namespace

DOPT_PLUGIN("fused", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::fused::FusedAlgorithm, "fused", "1.0.0",
                           "fused inner optimizer (sgd/adam/adamw): reduce buckets, then one "
                           "single-pass update per parameter group (Bagua fuse_optimizer)",
                           kOptions))
