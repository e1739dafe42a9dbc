// Which parameters `hybrid` steps on the host: Megatron-LM's
// HybridDeviceOptimizer._get_sub_optimizer_param_groups rule. Torch-free
// (also compiled into tests/hybrid's unit test).
#pragma once

#include <cstdint>
#include <vector>

namespace distopt::plugins::hybrid {

/// Megatron's greedy split: walk the parameters in order and offload each one
/// while the elements offloaded so far are below fraction x total (so the
/// last offloaded parameter may cross the threshold; fraction 0 offloads
/// none, fraction 1 all). `numels[i]` is parameter i's element count (>= 0);
/// result[i] is true when parameter i is offloaded. Throws
/// std::invalid_argument for a fraction outside [0, 1] or a negative numel.
/// Pure function, thread-safe.
std::vector<bool> offload_split(const std::vector<int64_t>& numels, double fraction);

}  // namespace distopt::plugins::hybrid
