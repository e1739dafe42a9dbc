// ABI glue of the `zero` plugin (ZeRO stages 1, 2 and 3; see zero_algorithm.hpp).
#include "zero_algorithm.hpp"

namespace {
namespace sdk = distopt::sdk;
constexpr dopt_option_spec kOptions[] = {
    sdk::option_int("stage", "1",
                    "1: optimizer state sharded (gradients averaged by the reducer); 2: gradients "
                    "reduce-scattered into each rank's shard during backward too (the reducer "
                    "is not used: only one that declares the exact mean, e.g. mean, is accepted); "
                    "3: the parameters of the model's units (distopt::ShardedUnit) sharded too, "
                    "gathered for each unit's forward and backward")
        .range(1, 3),
    sdk::option_string(
        "partition", "greedy",
        "stage 1: greedy = PyTorch ZeroRedundancyOptimizer's sorted-greedy over whole "
        "parameters; contiguous = the flat parameter space partitioned into W equal shards "
        "(stage 2 always partitions each bucket into W equal shards)")
        .choices("greedy|contiguous"),
    sdk::option_bool("parameters_as_bucket_view", "false",
                     "sync updated parameters with one allgather of each rank's packed "
                     "parameters (per bucket in stage 2) instead of one broadcast per parameter "
                     "or item shard"),
    sdk::option_bool("reshard_after_forward", "true",
                     "stage 3: free a unit's gathered parameters after its forward and gather "
                     "them again for its backward (FSDP's FULL_SHARD); false keeps them from "
                     "the forward until the unit's backward (SHARD_GRAD_OP: less traffic, more "
                     "memory)"),
    sdk::option_bool("overlap_comm", "false",
                     "stage 3: let a unit's gradient reduce-scatter run through the next "
                     "unit's whole backward (DeepSpeed's overlap_comm): more overlap, one more "
                     "unit's full gradients in memory; false completes it at the next unit's "
                     "first gradient and frees its gradients before the next unit's take memory"),
};
}  // namespace

DOPT_PLUGIN(
    "zero", "1.0.0",
    DOPT_COMPONENT(distopt::plugins::zero::ZeroAlgorithm, "zero", "1.0.0",
                   "ZeRO stages 1-3: optimizer state, gradients and parameters sharded over ranks",
                   kOptions))
