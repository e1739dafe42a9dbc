// The device rule for an optimizer's reducer and algorithm.
#include "optim/device_check.hpp"

#include <string>
#include <utility>
#include <vector>

#include "distopt/device_rule.hpp"
#include "distopt/error.hpp"

namespace distopt::optim {
namespace {

// DLPack's device type of a libtorch device (what the DLTensor descriptors
// the components get carry); -1 for a device DLPack here does not name.
int32_t dl_type(const at::Device& d) {
  if (d.is_cpu()) return kDLCPU;
  if (d.is_cuda()) return kDLCUDA;
  return -1;
}

struct Checked {
  std::string kind;  // "algorithm", "reducer", "inner reducer"
  const ComponentInfo* info;
};

}  // namespace

void check_param_devices(const OptimizerBuild& b) {
  std::vector<Checked> components{{"algorithm", &b.algorithm}, {"reducer", &b.reducer}};
  const InnerComponent* inner = b.reducer_options ? b.reducer_options->inner() : nullptr;
  if (inner) components.push_back({"inner reducer", &inner->info});
  for (const auto& [name, t] : b.params) {
    const int32_t type = dl_type(t.device());
    for (const Checked& c : components) {
      const std::string why = device_refusal(c.kind, c.info->name, c.info->devices, type);
      if (why.empty()) continue;
      const std::string where = type < 0 ? t.device().str() : dl_device_name(type);
      throw ComponentError(
          DOPT_ERR_UNSUPPORTED, c.info->plugin_name + "/" + c.info->name,
          "create (host device rule)",
          why + ": parameter '" + name + "' is on " + where +
              (c.kind == "inner reducer" ? " (inner of reducer '" + b.reducer.name + "')"
                                         : std::string()) +
              "; move the model to a device it declares or choose another " +
              (c.kind == "algorithm" ? "algorithm" : "reducer"));
    }
  }
}

}  // namespace distopt::optim
