// A test-only algorithm that shards the parameters of units
// (param_sharding: FULL) but has no discard_step, like an ABI 1.7 plugin:
// the host must refuse a job that runs it under mixed precision, naming
// `precision:` and this plugin's file, before it creates anything. Every
// method refuses (the host never gets that far). Torch-free.
#include "distopt/sdk/sdk.hpp"

namespace {

class NoDiscard : public distopt::sdk::Algorithm {
 public:
  explicit NoDiscard(const dopt_algorithm_args&) {
    throw distopt::sdk::Error(DOPT_ERR_INTERNAL, "no_discard: created despite mixed precision");
  }
  static int32_t param_sharding(const distopt::sdk::OptionsView&) {
    return DOPT_PARAM_SHARDING_FULL;
  }
  void on_bucket_ready(const dopt_bucket&) override {}
  void step() override {}
  void set_lr(int32_t, double) override {}
  uint64_t state_bytes() const override { return 0; }
};

}  // namespace

DOPT_PLUGIN("no_discard", "0.1.0",
            DOPT_COMPONENT(NoDiscard, "no_discard", "0.1.0",
                           "test: shards parameters, has no discard_step (ABI 1.7's shape)",
                           nullptr))
