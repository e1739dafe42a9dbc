// ABI glue of the `hybrid` plugin (Megatron-LM's HybridDeviceOptimizer; see
// hybrid_algorithm.hpp for what runs where).
#include "hybrid_algorithm.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_double("offload_fraction", "0.5",
                       "share of the parameters (by numel, greedy in parameter order as "
                       "Megatron) whose optimizer step runs on the host")
        .range(0, 1),
    sdk::option_bool("param_update_in_fp32", "false",
                     "step non-fp32 parameters through fp32 copies (host and device); a no-op "
                     "for fp32 parameters"),
    sdk::option_bool("overlap_cpu_optimizer_d2h_h2d", "true",
                     "copy gradients to the host and parameters back on their own threads "
                     "(side streams on a GPU), chunk by chunk, overlapping the host "
                     "steps; same result as false"),
    sdk::option_bool("refresh_masters", "true",
                     "before each step compare every offloaded parameter with what hybrid last "
                     "wrote and refresh its host copy from the model when it differs (model "
                     "weights loaded alone); false reproduces Megatron PR 5071's bug"),
    sdk::option_bool("shard", "false",
                     "ZeRO stage 1 over both parts: each rank keeps host copies and optimizer "
                     "state only for its 1/W range of the parameters (laid back to back), steps "
                     "it, and the updated parameters are allgathered"),
};
}  // namespace

DOPT_PLUGIN("hybrid", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::hybrid::HybridAlgorithm, "hybrid", "1.0.0",
                           "hybrid host/device optimizer (Megatron HybridDeviceOptimizer): reduce "
                           "buckets, step offload_fraction of the parameters on the host, the "
                           "rest in place",
                           kOptions))
