// Private: what Runtime::make_optimizer hands the optimizer it builds.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distopt/abi.h"
#include "distopt/communicator.h"
#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/precision.hpp"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"

namespace distopt::optim {

class BufferSynchronizer;

struct OptimizerBuild {
  std::shared_ptr<const void> keepalive;  ///< the runtime state (communicator, store, options)
  std::vector<std::pair<std::string, at::Tensor>> params;  ///< already broadcast from rank 0
  std::vector<ParamGroupSpec> groups;
  ComponentInfo reducer, algorithm;
  const Options* reducer_options = nullptr;  ///< includes core's bucket options
  const Options* algorithm_options = nullptr;
  const Options* optimizer_options = nullptr;
  std::string optimizer_name;
  dopt_comm_ref comm{nullptr, nullptr};
  dopt_create_args
      common{};       ///< rank, world, store, token, bind; options / scope set per component
  std::string scope;  ///< unique per optimizer, identical across ranks ("optimizer/0")
  PrecisionConfig precision;  ///< mixed precision (off by default)
  /// Module buffers kept equal across ranks after every step (null: none
  /// set). Shared so that add_param_group's rebuild keeps it.
  std::shared_ptr<BufferSynchronizer> buffers;
  JobConfig::Join join;  ///< uneven inputs (DistributedOptimizer::join)
};

/// Plan buckets, install hooks, create the reducer then the algorithm.
/// Collective. Throws ConfigError (bad groups), ComponentError.
DistributedOptimizer build_optimizer(OptimizerBuild build);
/// The same, as the bare state (add_param_group builds a replacement next to
/// the optimizer it replaces). On a throw nothing is left behind: the hooks
/// it installed are removed, what it created is destroyed.
std::unique_ptr<DistributedOptimizer::Impl> build_impl(OptimizerBuild build);

}  // namespace distopt::optim
