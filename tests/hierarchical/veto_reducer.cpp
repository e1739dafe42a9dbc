// Test-only reducer `veto` (built into build/test-plugins/hierarchical, never
// build/plugins, which jobs scan): its check_job refuses `level: 3`, naming
// the key as a top-level reducer would, so that the host's handling of an
// inner reducer's refusal (ABI 1.3: read as reducer.inner.options.level) can
// be tested. It is never created (create fails): check time only.
#include "distopt/sdk/sdk.hpp"

namespace distopt::plugins::veto {

class VetoReducer : public sdk::Reducer {
 public:
  VetoReducer(const dopt_create_args&, dopt_comm_ref, const dopt_bucket*, size_t) {
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, "veto: a check-time test reducer");
  }
  static void check_job(const sdk::JobView& job) {
    if (job.self().options().get_int("level") == 3)
      job.reject("reducer.options.level",
                 "veto: level 3 is refused (outer reducer '" + job.reducer().name() + "')");
  }
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket&) override { return nullptr; }
  uint64_t bytes_sent() const override { return 0; }
};

constexpr dopt_option_spec kOptions[] = {
    sdk::option_int("level", "1", "3 is refused at check time").range(0, 9),
};

}  // namespace distopt::plugins::veto

DOPT_PLUGIN("veto", "1.0.0",
            DOPT_COMPONENT(distopt::plugins::veto::VetoReducer, "veto", "1.0.0",
                           "test-only: refuses level 3 at check time",
                           distopt::plugins::veto::kOptions))
