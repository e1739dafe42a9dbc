#include "settings.hpp"

#include "distopt/sdk/base/options.hpp"

namespace distopt::plugins::nccl {

Settings Settings::from(const dopt_options* options) {
  Settings s;
  if (!options) return s;
  sdk::OptionsView o(options);
  s.timeout_s = o.get_double("timeout_s");
  s.device = o.get_int("device");
  s.abort_grace_s = o.get_double("abort_grace_s");
  s.watchdog_poll_ms = o.get_int("watchdog_poll_ms");
  return s;
}

}  // namespace distopt::plugins::nccl
