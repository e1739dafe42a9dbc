// Private: what Runtime::make_optimizer hands the optimizer it builds.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distopt/abi.h"
#include "distopt/communicator.h"
#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/lr_schedule.hpp"
#include "distopt/precision.hpp"
#include "distopt/registry.hpp"
#include "distopt/sharded_unit.hpp"

namespace distopt::optim {

class BufferSynchronizer;
class Autotuner;

/// A reducer and an algorithm found in the registry, with their validated
/// options (a schedule phase, or what switch_to was given).
struct ComponentChoice {
  ComponentInfo reducer, algorithm;
  std::shared_ptr<const Options> reducer_options, algorithm_options;
};

/// One `schedule:` phase, resolved (config.hpp SchedulePhase).
struct Phase {
  int64_t until_epoch = -1, until_step = -1;
  ComponentChoice choice;
};

/// Finds and validates the components of a switch_to call against the job
/// (its registry, file and world size). Throws ConfigError / PluginError.
using Resolver = std::function<ComponentChoice(const ComponentConfig& algorithm,
                                               const ComponentConfig& reducer)>;

/// One parameter group as the optimizer builds it (Runtime::make_optimizer
/// copies its ParamGroupSpecs into these; add_param_group appends one).
struct GroupSpec {
  std::vector<std::string> names;  ///< parameters in this group (others go to group 0)
  double lr = -1;                  ///< -1: the optimizer's `lr`
  double weight_decay = -1;        ///< -1: the optimizer's `weight_decay`
};

struct OptimizerBuild {
  std::shared_ptr<const void> keepalive;  ///< the runtime state (communicator, store, options)
  std::vector<std::pair<std::string, at::Tensor>> params;  ///< already broadcast from rank 0
  std::vector<GroupSpec> groups;
  ComponentInfo reducer, algorithm;
  const Options* reducer_options = nullptr;  ///< includes core's bucket options
  const Options* algorithm_options = nullptr;
  const Options* optimizer_options = nullptr;
  std::string optimizer_name;
  dopt_comm_ref comm{nullptr, nullptr};  ///< the job's communicator (reducers, algorithms)
  uint32_t comm_devices = 0;             ///< its ComponentInfo::devices
  /// The host's control collectives in host memory (Runtime::control_communicator;
  /// equal to `comm` when that accepts kDLCPU).
  dopt_comm_ref control{nullptr, nullptr};
  dopt_create_args
      common{};          ///< rank, world, store, token, bind; options / scope set per component
  std::string scope;     ///< unique per optimizer, identical across ranks ("optimizer/0")
  std::string job_path;  ///< the job file, for errors that name a key of it
  PrecisionConfig precision;  ///< mixed precision (off by default)
  /// Module buffers kept equal across ranks after every step (null: none
  /// set). Shared so that add_param_group's rebuild keeps it.
  std::shared_ptr<BufferSynchronizer> buffers;
  JobConfig::Join join;  ///< uneven inputs (DistributedOptimizer::join)
  /// Keeps reducer_options / algorithm_options alive when they are not the
  /// runtime's (a switch_to).
  std::shared_ptr<const void> choice_keepalive;
  std::vector<Phase> schedule;  ///< empty: no schedule
  int phase = -1;               ///< index into schedule; -1 without one
  Resolver resolve;             ///< for switch_to
  int rebuilds = 0;             ///< add_param_group / switch_to so far (unique scopes)
  /// optimizer.lr_schedule (empty: none); rebuilds keep it. Validated
  /// (total_steps known) before it is stored here.
  std::optional<LrSchedule> lr_schedule;
  /// optimizer.grad_clip (0 = off), handed to every algorithm build_impl
  /// creates through its ABI 1.5 set_grad_clip.
  double grad_clip = 0;
  /// `autotune:` (null when off); shared so that rebuilds keep it.
  std::shared_ptr<Autotuner> tuner;
  /// Parameter sharding units (distopt/sharded_unit.hpp), found by
  /// make_optimizer(module): per parameter its unit or -1 (empty: no units),
  /// and per unit its wrapper's link and module name.
  std::vector<int> param_units;
  std::vector<std::shared_ptr<UnitSlot>> unit_slots;
  std::vector<std::string> unit_names;
  std::vector<std::string> unit_notes;  ///< logged at rank 0 when the algorithm shards
  /// Mixed precision: fp32 values for the masters by parameter name (a
  /// rebuild's, from the optimizer it replaces); null: the model's values.
  /// build_impl drops it once the masters exist.
  std::shared_ptr<const std::map<std::string, at::Tensor>> initial_masters;
};

/// The communicator for a host collective on memory of `device_type`:
/// `b.comm` when it accepts that device, else `b.control`.
dopt_comm_ref comm_for(const OptimizerBuild& b, int32_t device_type);

/// `choice` as the build's reducer and algorithm.
void use_components(OptimizerBuild& b, const ComponentChoice& choice);

/// Plan buckets, install hooks, create the reducer then the algorithm.
/// Collective. Throws ConfigError (bad groups), ComponentError.
DistributedOptimizer build_optimizer(OptimizerBuild build);
/// The same, as the bare state (add_param_group builds a replacement next to
/// the optimizer it replaces). On a throw nothing is left behind: the hooks
/// it installed are removed, what it created is destroyed.
std::unique_ptr<DistributedOptimizer::Impl> build_impl(OptimizerBuild build);

}  // namespace distopt::optim
