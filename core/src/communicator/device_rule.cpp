// The ABI 1.4 device rule's text (distopt/device_rule.hpp).
#include "distopt/device_rule.hpp"

#include "distopt/registry.hpp"

namespace distopt {

bool device_accepted(uint32_t devices, int32_t device_type) {
  if (devices == 0) devices = DOPT_DEVICES_DEFAULT;
  return device_type >= 0 && device_type < 32 && (devices & DOPT_DEVICE_BIT(device_type)) != 0;
}

std::string device_refusal(const std::string& kind, const std::string& name, uint32_t devices,
                           int32_t device_type) {
  if (device_accepted(devices, device_type)) return "";
  if (devices == 0) devices = DOPT_DEVICES_DEFAULT;
  return kind + " '" + name + "' does not accept " + dl_device_name(device_type) +
         " memory (it declares " + devices_text(devices) + ")";
}

std::string comm_device_refusal(const std::string& comm_name, uint32_t devices, const DLTensor& t) {
  const int32_t type = t.device.device_type;
  std::string why = device_refusal("communicator", comm_name, devices, type);
  if (why.empty()) return why;
  return why + "; copy the tensor to a device it accepts or choose a communicator that declares " +
         dl_device_name(type);
}

}  // namespace distopt
