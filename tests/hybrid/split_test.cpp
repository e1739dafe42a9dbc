// offload_split: Megatron-LM's greedy rule (HybridDeviceOptimizer.
// _get_sub_optimizer_param_groups): parameters in order are offloaded while
// the offloaded elements are below fraction x total. Torch-free.
#include <doctest/doctest.h>

#include <stdexcept>
#include <vector>

#include "offload_split.hpp"

using distopt::plugins::hybrid::offload_split;
using V = std::vector<bool>;

TEST_CASE("offload_split: Megatron's greedy rule, in parameter order") {
  const std::vector<int64_t> mlp = {640, 32, 512, 16, 160, 10};  // tests' Mlp3, 1370 elements
  CHECK(offload_split(mlp, 0) == V{false, false, false, false, false, false});
  CHECK(offload_split(mlp, 1) == V{true, true, true, true, true, true});
  // 0.3 x 1370 = 411: fc1.weight (640) is taken while 0 < 411, then 640 >= 411.
  CHECK(offload_split(mlp, 0.3) == V{true, false, false, false, false, false});
  // 685: 0, 640 and 672 are below it; 1184 is not.
  CHECK(offload_split(mlp, 0.5) == V{true, true, true, false, false, false});
  // The last offloaded parameter may cross the threshold; order matters, not size.
  CHECK(offload_split({10, 1000, 1}, 0.001) == V{true, false, false});
  CHECK(offload_split({1, 1000, 10}, 0.01) == V{true, true, false});
  CHECK(offload_split({}, 0.5).empty());
  CHECK(offload_split({0, 0}, 1) == V{false, false});  // nothing to offload: 0 < 0 is false
}

TEST_CASE("offload_split refuses a fraction outside [0, 1] and negative sizes") {
  CHECK_THROWS_AS(offload_split({1, 2}, 1.5), std::invalid_argument);
  CHECK_THROWS_AS(offload_split({1, 2}, -0.1), std::invalid_argument);
  CHECK_THROWS_AS(offload_split({1, -2}, 0.5), std::invalid_argument);
}
