// ABI glue of the `powersgd` plugin: the option schema and the component.
#include <limits>

#include "powersgd_reducer.hpp"

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr dopt_option_spec kOptions[] = {
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "rank", DOPT_OPTION_INT, "4", 1, 65536, nullptr,
     "approximation rank r: each n x m gradient matrix is sent as P (n x r) and Q (m x r); "
     "clamped to min(n, m)"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "warm_start", DOPT_OPTION_BOOL, "true", 0, -1, nullptr,
     "reuse each matrix's Q of the previous step as the start of this step's power iteration "
     "(false: fresh random Q every step)"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "reuse_query", DOPT_OPTION_BOOL, "true", 0, -1, nullptr,
     "mlbench's name for warm_start; warm start is on only if both are true"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "start_iter", DOPT_OPTION_INT, "10", 0, 2147483647.0,
     nullptr,
     "steps of plain average allreduce before compression starts (per bucket; PyTorch's "
     "start_powerSGD_iter)"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "min_compression_rate", DOPT_OPTION_DOUBLE, "2", 0,
     kInf, nullptr,
     "a matrix is compressed only if (n + m) r x this < n m, else sent uncompressed with the 1-D "
     "tensors "
     "(0: compress every matrix)"},
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "seed", DOPT_OPTION_INT, "0", 0, 9007199254740992.0,
     nullptr, "seed of the random Q's (the same on every rank)"},
};
}  // namespace

DOPT_PLUGIN(
    "powersgd", "1.0.0",
    DOPT_COMPONENT(
        distopt::plugins::powersgd::PowerSgdReducer, "powersgd", "1.0.0",
        "PowerSGD low-rank gradient compression with error feedback (Vogels et al., NeurIPS 2019)",
        kOptions))
