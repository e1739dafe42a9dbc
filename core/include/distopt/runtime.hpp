// Embedding API: the runtime of one rank (rendezvous, plugins, communicator)
// and the optimizer it builds. See share/doc/distopt/DESIGN.md, "Embedding".
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "distopt/checkpoint.hpp"
#include "distopt/config.hpp"
#include "distopt/process.hpp"

namespace distopt {

class Communicator;
class PluginRegistry;
class Store;
class DistributedOptimizer;
struct UnitSlot;  // distopt/sharded_unit.hpp
namespace runtime {
class ElasticLink;  // core-internal: what elastic recovery may change (re-create the communicators)
}

/// Per-group settings for make_optimizer (negative = the optimizer's default).
struct ParamGroupSpec {
  std::vector<std::string> names;  ///< parameters in this group (others go to group 0)
  double lr = -1;
  double weight_decay = -1;
};

/// The runtime of one rank. Cheap to copy (shared state). Created once per
/// process; rank and world size come from the environment (process.hpp)
/// unless the job runs as a single process.
class Runtime {
 public:
  /// Load and validate `path`, discover plugins, rendezvous with the other
  /// ranks and create the communicator. Also sizes the intra-op thread pools
  /// as `distopt train` does (threads.hpp: train.threads, else
  /// $OMP_NUM_THREADS, else the host's cores / its ranks); call
  /// at::set_num_threads afterwards to override. Throws ConfigError,
  /// PluginError, RendezvousError, ComponentError.
  static Runtime from_yaml(const std::string& path);
  /// from_yaml($DISTOPT_CONFIG), the job file `distopt launch --config`
  /// exports. Throws ConfigError when DISTOPT_CONFIG is unset, and as
  /// from_yaml.
  static Runtime from_env();
  static Runtime from_config(const JobConfig& cfg);
  /// As from_config, with rank / world size given instead of read from the
  /// environment (tests, embedding in a program with its own launcher).
  static Runtime from_config(const JobConfig& cfg, const ProcessInfo& proc);

  int rank() const;
  int world_size() const;
  int local_rank() const;
  /// Elastic training: true in a restarted rank that joined a running job
  /// (elastic.enabled and DISTOPT_RESTART_COUNT > 0, set by `distopt launch
  /// --elastic --max-restarts N`, or DISTOPT_ELASTIC_JOIN=1, set by `distopt
  /// launch --elastic --join` for a new process) until distopt::Elastic's constructor has
  /// taken the job's state from the peers. from_config then admitted it at
  /// the running ranks' next commit instead of the rendezvous (rank() and
  /// world_size() are the new membership's), and make_optimizer broadcasts
  /// nothing; construct distopt::Elastic right after make_optimizer.
  bool joining() const;
  const JobConfig& config() const;
  PluginRegistry& registry() const;
  Store& store() const;
  /// The job's communicator (`communicator:`): gradients and parameters.
  Communicator& communicator() const;
  /// The communicator of the host's own collectives in host memory
  /// (evaluation sums, flags, agreements, checkpoint exchanges): the
  /// `control_communicator:` when the job has one (always when the job's
  /// communicator does not accept kDLCPU memory, e.g. `nccl`), else
  /// communicator(). Collectives on it are ordered independently of those
  /// on communicator().
  Communicator& control_communicator() const;

  /// Build the distributed optimizer for these parameters (the algorithm,
  /// reducer and inner optimizer of the config). Collective. Parameters are
  /// broadcast from rank 0 first so every rank starts equal. Throws as above.
  DistributedOptimizer make_optimizer(
      const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
      const std::vector<ParamGroupSpec>& groups = {});
  /// Convenience: named_parameters() of a module, and its buffers broadcast
  /// from rank 0 now and kept in sync after every step() as the job's
  /// `buffers.sync` says (DistributedOptimizer::set_buffers). The module's
  /// distopt::ShardedUnit submodules are the units of parameter sharding
  /// (sharded_unit.hpp) when the algorithm shards parameters (zero stage 3).
  /// A parameter registered under several names (tied) is one, first name.
  DistributedOptimizer make_optimizer(torch::nn::Module& module,
                                      const std::vector<ParamGroupSpec>& groups = {});

  // ---- Checkpoints (checkpoint.hpp has the layout) ----

  /// Save `model` (parameters and buffers, written by rank 0) and `opt` (the
  /// algorithm's and reducer's state through ABI 1.1 save_state, steps, loss
  /// scale) as a new checkpoint in `dir` (created if missing), then delete all
  /// but the newest `keep` (>= 1) complete checkpoints there. Collective:
  /// every rank calls it between steps. `extra` goes into the manifest.
  /// Throws CheckpointError (I/O, naming the file), ComponentError
  /// (UNSUPPORTED naming a plugin built against ABI 1.0, which has no
  /// save_state), CommError; on any failure the previous checkpoint stays
  /// the newest.
  CheckpointInfo save_checkpoint(const std::string& dir, torch::nn::Module& model,
                                 DistributedOptimizer& opt, const CheckpointExtra& extra = {},
                                 int keep = 2);
  /// Restore the newest checkpoint in `dir` into `model` and `opt`, which
  /// must be built as for the saved job except for the world size (a
  /// sharded algorithm reads the ranges it owns now) and, for state kept
  /// under the shared key conventions, the algorithm. Collective, between
  /// steps. Verifies every shard's size and CRC-32 and the model's names and
  /// shapes before changing anything. Throws CheckpointError naming the file
  /// or key (missing, corrupt, truncated, other model), ComponentError from a
  /// plugin's load_state. Never writes to `dir`.
  CheckpointInfo load_checkpoint(const std::string& dir, torch::nn::Module& model,
                                 DistributedOptimizer& opt);
  /// ZeroRedundancyOptimizer.consolidate_state_dict(to): gather the whole
  /// state onto rank `to`. Collective. Returns on rank `to` every logical
  /// tensor whole, keyed "model/<name>", "algorithm/<key>", "reducer/<key>"
  /// (rank-local entries as "<key>@rank<r>"); an empty map elsewhere. Throws
  /// as save_checkpoint.
  std::map<std::string, torch::Tensor> consolidate(torch::nn::Module& model,
                                                   DistributedOptimizer& opt, int to = 0);

  /// Broadcast tensors (in place) from rank `root`. Collective. Each tensor
  /// goes over communicator() when it accepts the tensor's device, else
  /// over control_communicator() (host tensors beside `nccl`).
  void broadcast(const std::vector<torch::Tensor>& tensors, int root = 0);
  /// Sum (or average) a small tensor across ranks in place. Collective;
  /// routed by the tensor's device as broadcast.
  void allreduce(torch::Tensor& t, bool average);
  /// Collective barrier, on control_communicator().
  void barrier();

  struct Impl;

 private:
  friend class runtime::ElasticLink;
  explicit Runtime(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  /// Units of parameter sharding: per parameter its unit or -1, per unit its
  /// wrapper's link and name.
  struct Units {
    std::vector<int> of_param;
    std::vector<std::shared_ptr<UnitSlot>> slots;
    std::vector<std::string> names;
    std::vector<std::string> notes;  // where shared parameters went
  };
  DistributedOptimizer build_optimizer(
      const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
      const std::vector<ParamGroupSpec>& groups, Units units);
  /// The ShardedUnit modules of `module` and, per parameter of `named`, the
  /// innermost unit enclosing every module that holds it (tied weights: their
  /// common enclosing unit), or -1 when no unit encloses them all.
  static Units find_units(torch::nn::Module& module,
                          const std::vector<std::pair<std::string, torch::Tensor>>& named);
  std::shared_ptr<Impl> impl_;
};

}  // namespace distopt
