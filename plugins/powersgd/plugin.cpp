// ABI glue of the `powersgd` plugin: the option schema and the component.
#include "powersgd_reducer.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_int("rank", "4",
                    "approximation rank r: each n x m gradient matrix is sent as P (n x r) and Q "
                    "(m x r); clamped to min(n, m)")
        .range(1, 65536),
    sdk::option_bool("warm_start", "true",
                     "reuse each matrix's Q of the previous step as the start of this step's "
                     "power iteration (false: fresh random Q every step)"),
    sdk::option_bool("reuse_query", "true",
                     "mlbench's name for warm_start; warm start is on only if both are true"),
    sdk::option_int("start_iter", "10",
                    "steps of plain average allreduce before compression starts (per bucket; "
                    "PyTorch's start_powerSGD_iter)")
        .range(0, 2147483647.0),
    sdk::option_double("min_compression_rate", "2",
                       "a matrix is compressed only if (n + m) r x this < n m, else sent "
                       "uncompressed with the 1-D tensors (0: compress every matrix)")
        .at_least(0),
    sdk::option_int("seed", "0", "seed of the random Q's (the same on every rank)")
        .range(0, 9007199254740992.0),
    sdk::option_string("kernels", "auto",
                       "orthogonalisation: auto (CPU loop for host buckets, libtorch ops on the "
                       "bucket's device for CUDA), cpu (host buckets only), generic (libtorch "
                       "ops on any device; float-tolerance equal to the loop)")
        .choices("auto|cpu|generic"),
};
}  // namespace

DOPT_PLUGIN(
    "powersgd", "1.0.0",
    DOPT_COMPONENT(
        distopt::plugins::powersgd::PowerSgdReducer, "powersgd", "1.0.0",
        "PowerSGD low-rank gradient compression with error feedback (Vogels et al., NeurIPS 2019)",
        kOptions))
