#include "partition.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace distopt::plugins::zero {

std::vector<int32_t> greedy_partition(const std::vector<ParamSize>& sizes, int32_t world) {
  if (world < 1) throw std::invalid_argument("zero: world size must be >= 1");
  std::vector<int32_t> owners(sizes.size(), 0);
  std::vector<size_t> totals(static_cast<size_t>(world), 0);
  std::vector<int32_t> groups;
  for (const auto& s : sizes) groups.push_back(s.group);
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  for (int32_t g : groups) {
    std::vector<size_t> order;
    for (size_t i = 0; i < sizes.size(); ++i)
      if (sizes[i].group == g) order.push_back(i);
    // Python's sorted(..., reverse=True) is stable: equal sizes keep their order.
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return sizes[a].numel > sizes[b].numel; });
    for (size_t i : order) {
      auto r = static_cast<size_t>(std::min_element(totals.begin(), totals.end()) - totals.begin());
      owners[i] = static_cast<int32_t>(r);
      totals[r] += sizes[i].numel;
    }
  }
  return owners;
}

std::vector<size_t> rank_totals(const std::vector<ParamSize>& sizes,
                                const std::vector<int32_t>& owners, int32_t world) {
  std::vector<size_t> totals(static_cast<size_t>(std::max(world, 0)), 0);
  for (size_t i = 0; i < sizes.size() && i < owners.size(); ++i)
    if (owners[i] >= 0 && owners[i] < world)
      totals[static_cast<size_t>(owners[i])] += sizes[i].numel;
  return totals;
}

}  // namespace distopt::plugins::zero
