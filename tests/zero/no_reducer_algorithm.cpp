// A test-only algorithm that never hands a bucket to the job's reducer and
// has no check_job, like an ABI 1.1 plugin: the host cannot refuse a
// compressing reducer for it at check time, so `distopt train` must still
// warn after the first step that the reducer did not apply. It updates
// nothing (the test looks at the warning only). Torch-free.
#include "distopt/sdk/sdk.hpp"

namespace {

class NoReducer : public distopt::sdk::Algorithm {
 public:
  explicit NoReducer(const dopt_algorithm_args&) {}
  void on_bucket_ready(const dopt_bucket&) override {}
  void step() override {}
  void set_lr(int32_t, double) override {}
  uint64_t state_bytes() const override { return 0; }
};

}  // namespace

DOPT_PLUGIN("no_reducer", "0.1.0",
            DOPT_COMPONENT(NoReducer, "no_reducer", "0.1.0",
                           "test: ignores the reducer and updates nothing (no check_job)", nullptr))
