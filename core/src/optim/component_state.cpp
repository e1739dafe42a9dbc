// The reducer's and algorithm's ABI 1.1 state (save_state / load_state) as
// a checkpoint, add_param_group and switch_to take it.
#include "optim/component_state.hpp"

#include <ATen/ATen.h>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "optim/optimizer_impl.hpp"

namespace distopt::optim {

const std::string kAlgorithmPrefix = "algorithm/";
const std::string kReducerPrefix = "reducer/";

namespace {

template <class VT>
bool has_state_api(const VT* vt, size_t size_1_1) {
  return vt && vt->struct_size >= size_1_1 && vt->save_state && vt->load_state;
}

[[noreturn]] void no_state_api(const ComponentInfo& c, const char* kind) {
  throw ComponentError(DOPT_ERR_UNSUPPORTED, c.plugin_name + "/" + c.name, "save_state",
                       std::string("the ") + kind + " plugin " + c.file + " was built for ABI " +
                           std::to_string(c.abi_major) + "." + std::to_string(c.abi_minor) +
                           ", which has no save_state/load_state; rebuild it against ABI 1.1+ "
                           "for checkpoints and add_param_group");
}

}  // namespace

void require_state_api(DistributedOptimizer::Impl& m) {
  if (!has_state_api(m.avt, DOPT_ALGORITHM_V1_1_STRUCT_SIZE))
    no_state_api(m.build.algorithm, "algorithm");
  if (!has_state_api(m.rvt, DOPT_REDUCER_V1_1_STRUCT_SIZE))
    no_state_api(m.build.reducer, "reducer");
}

void snapshot_components(DistributedOptimizer::Impl& m, state::ShardState& s) {
  require_state_api(m);
  at::NoGradGuard no_grad;
  if (!s.replicas_rule_set()) s.keep_replicas(false, m.build.common.rank);
  dopt_state_writer rw = s.writer(&kReducerPrefix);
  check_status(m.rvt->save_state(m.reducer, &rw), m.reducer_who, "save_state");
  dopt_state_writer aw = s.writer(&kAlgorithmPrefix);
  check_status(m.avt->save_state(m.algorithm, &aw), m.algorithm_who, "save_state");
}

}  // namespace distopt::optim
