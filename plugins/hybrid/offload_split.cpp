#include "offload_split.hpp"

#include <stdexcept>
#include <string>

namespace distopt::plugins::hybrid {

std::vector<bool> offload_split(const std::vector<int64_t>& numels, double fraction) {
  if (!(fraction >= 0 && fraction <= 1))
    throw std::invalid_argument("offload_fraction " + std::to_string(fraction) +
                                " is outside [0, 1]");
  double total = 0;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("negative parameter size");
    total += static_cast<double>(n);
  }
  const double threshold = fraction * total;
  std::vector<bool> out(numels.size(), false);
  double offloaded = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    // Megatron: `if offload_params_numel < offload_threshold`, checked
    // before adding the parameter.
    if (offloaded < threshold) {
      out[i] = true;
      offloaded += static_cast<double>(numels[i]);
    }
  }
  return out;
}

}  // namespace distopt::plugins::hybrid
