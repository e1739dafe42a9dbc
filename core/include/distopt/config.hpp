// The job's YAML configuration (share/doc/distopt/DESIGN.md, "Configuration").
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distopt/buffers.hpp"
#include "distopt/component_options.hpp"
#include "distopt/lr_schedule.hpp"
#include "distopt/precision.hpp"

namespace distopt {

class PluginRegistry;

/// A `{name: ..., options: {...}}` section. `options` is kept as YAML until
/// validated against the selected component's schema.
struct ComponentConfig {
  std::string name;
  YAML::Node options;  ///< map, or null when absent
  YAML::Mark mark;     ///< where the section starts (for error messages)
  YAML::Node node;     ///< the section as written (null when absent)
  /// Reducer sections (ABI 1.3): the `inner: {name, options}` reducer the
  /// selected one wraps, or null. Its own `inner` is always null.
  std::shared_ptr<const ComponentConfig> inner = nullptr;
};

/// `train:` section (used by `distopt train`).
/// train.synthetic: the generated dataset of `dataset: synthetic`
/// (tools/distopt/train/synthetic.hpp): sample counts, image shape
/// [channels, height, width], classes, noise std.
struct SyntheticConfig {
  int64_t train_samples = 50000, test_samples = 10000;
  int64_t channels = 3, height = 32, width = 32, classes = 10;
  double noise = 1.0;
};

struct TrainConfig {
  std::string model = "mlp";  ///< mlp | cnn | resnet | torchscript
  /// train.model: {torchscript: PATH}: the TorchScript file (resolved
  /// against the job file's directory); model is then "torchscript".
  std::string torchscript;
  /// train.model_width: resnet's base channel count; 0 = 8 on the CPU, 64
  /// (ResNet-18) on a GPU.
  int64_t model_width = 0;
  std::string dataset = "fashion-mnist";  ///< fashion-mnist | synthetic | tensors
  SyntheticConfig synthetic;
  /// train.tensors: {train: PATH, test: PATH} of `dataset: tensors` (files of
  /// Python's torch.save; resolved against the job file's directory).
  std::string train_tensors, test_tensors;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t epochs = 2;
  int64_t batch_size = 256;  ///< per rank
  /// train.global_batch_size: samples per step over all ranks (0: batch_size
  /// x world size). Set, or in an elastic job, it stays the same when the
  /// world size changes: rank r of W takes samples [G r / W, G (r + 1) / W)
  /// of each global batch, its loss weighted by its share, so the gradient
  /// is the global batch's mean on any world size.
  int64_t global_batch_size = 0;
  int64_t seed = 0;
  int64_t threads = 0;     ///< intra-op threads per rank; 0 = cores / local ranks
  int64_t log_every = 20;  ///< steps between progress lines
  int64_t max_steps = 0;   ///< stop after this many steps per epoch (0 = all)
  /// Micro-batches per step (DistributedOptimizer::no_sync): each rank's
  /// batch_size samples run as this many forward/backward passes, the
  /// gradients accumulate and are reduced once; 1 = off.
  int64_t grad_accumulation = 1;
  /// train.drop_last: drop the epoch's last partial global batch (true), or
  /// split it among the ranks in batch_size slices; ranks left without
  /// samples call DistributedOptimizer::join() (false; turns join.enabled on).
  bool drop_last = true;
  /// train.device: where the model, the batches and the gradient buckets
  /// live: "cpu", "cuda" (the GPU of index local rank) or "cuda:N". Anything
  /// but "cpu" is refused at parse time when torch::cuda::is_available() is
  /// false (a CPU-only libtorch, e.g. Debian's, or no GPU visible).
  std::string device = "cpu";
};

/// One phase of `schedule:` (Bagua's ModelSwitchWrapper.switch_to, as a
/// plan): the reducer and algorithm to run until a bound. A phase that leaves
/// out `algorithm` or `reducer` takes the job's top-level section.
struct SchedulePhase {
  /// The phase ends once set_epoch(e) is called with e >= until_epoch (after
  /// that many epochs), or once until_step optimizer steps are done; -1: no
  /// bound (the last phase, which runs to the end).
  int64_t until_epoch = -1;
  int64_t until_step = -1;
  ComponentConfig reducer, algorithm;
  YAML::Mark mark;  ///< where the phase starts
};

struct JobConfig {
  std::string path;                       ///< file it came from ("<string>" if none)
  std::vector<std::string> plugin_paths;  ///< plugins.paths, resolved against the file's directory
  /// Each plugins.paths entry as the file wrote it, resolved, with where it
  /// is written (check_plugin_dirs); plugin_paths may gain CLI directories.
  struct PluginDir {
    std::string written, resolved;
    YAML::Mark mark;
  };
  std::vector<PluginDir> plugin_dirs;
  int64_t world_size = 1;       ///< world.size
  bool world_size_set = false;  ///< the file writes world.size (else the default 1)
  YAML::Mark world_size_mark;   ///< where world.size is written (world_size_set)
  std::string rendezvous = "tcp://127.0.0.1:29500";  ///< world.rendezvous
  double timeout_s = 60;  ///< world.timeout_s: rendezvous and default op timeout
  /// world.collective_check_s: a collective wait this long (seconds) makes
  /// the ranks compare what they wait on and fail naming a mismatch
  /// (host_communicator.hpp, CollectiveCheck); 0 turns the check off.
  double collective_check_s = 2;
  /// world.watchdog_s: a call into a component (an algorithm's step, a
  /// communicator's collective) that has not returned after this many
  /// seconds ends the rank with a message naming the rank, the component
  /// and the operation (distopt/watchdog.hpp), as a dead peer ends the job.
  /// 0 (the default): twice world.timeout_s, so a collective's own timeout,
  /// which names the peer, fires first. watchdog_seconds() resolves it.
  double watchdog_s = 0;
  double watchdog_seconds() const { return watchdog_s > 0 ? watchdog_s : 2 * timeout_s; }
  ComponentConfig communicator{"tcp", {}, {}, {}, nullptr};
  /// `control_communicator:` the host-memory communicator for the host's own
  /// collectives (evaluation sums, inf/NaN and join flags, checkpoint,
  /// switch and add_param_group agreements, state exchanges), as PyTorch
  /// keeps a gloo group beside NCCL. Absent (name ""): the job's
  /// communicator when it accepts kDLCPU memory, else a `tcp` over the same
  /// rendezvous. Set: always created, and must declare kDLCPU.
  ComponentConfig control_communicator{"", {}, {}, {}, nullptr};
  ComponentConfig reducer{"mean", {}, {}, {}, nullptr};
  ComponentConfig algorithm{"allreduce", {}, {}, {}, nullptr};
  /// `schedule:` phases in order (empty: the top-level reducer and algorithm
  /// for the whole run). Every phase but the last has exactly one bound, each
  /// kind of bound strictly increasing; the last has none.
  std::vector<SchedulePhase> schedule;
  std::string optimizer_name = "sgd";  ///< optimizer.name
  YAML::Node optimizer_options;        ///< the other keys of `optimizer:`
  YAML::Mark optimizer_mark;
  /// optimizer.lr_schedule (lr_schedule.hpp); absent: none (the lr stays as
  /// set). A host key, not passed to the inner optimizer.
  std::optional<LrSchedule> lr_schedule;
  /// optimizer.grad_clip: max global L2 norm of the gradients the inner
  /// optimizer applies (0 = off); every algorithm (ABI 1.5 set_grad_clip).
  double grad_clip = 0;
  TrainConfig train;
  PrecisionConfig precision;  ///< precision: (absent = fp32, off); see precision.hpp
  YAML::Mark precision_mark;  ///< where `precision:` (or its dtype) is written
  BufferSync buffer_sync = BufferSync::broadcast;  ///< buffers.sync
  /// `join:` uneven inputs (DistributedOptimizer::join). enabled (off by
  /// default, as PyTorch's Join is opt-in): every step starts with a 4-byte
  /// allreduce counting the ranks that have not joined (skipped on 1 rank;
  /// ~0.2 ms on 2 local ranks, ~2% of the quickstart's step);
  /// divide_by_initial_world_size: average the
  /// gradients over the world size even while ranks have joined (PyTorch
  /// DDP's option) instead of over the ranks that contributed.
  struct Join {
    bool enabled = false;
    bool divide_by_initial_world_size = false;
  } join;
  /// `elastic:` elastic training (distopt/elastic.hpp; torchft's per-step
  /// quorum, Horovod Elastic's commit/restore). enabled: when a peer dies
  /// the survivors agree on a new membership through the rendezvous store,
  /// re-create their communicators and go on from the last in-memory
  /// commit; min_ranks: fewer survivors end the job (ElasticError);
  /// max_ranks: the largest world (0 = the starting world size);
  /// commit_every: optimizer steps between in-memory commits;
  /// settle_s: how long a recovery waits for survivors the launcher has
  /// not declared dead before closing the membership.
  struct Elastic {
    bool enabled = false;
    int64_t min_ranks = 1;
    int64_t max_ranks = 0;
    int64_t commit_every = 1;
    double settle_s = 2.0;
  } elastic;
  /// `autotune:` (Bagua's autotuning of communication settings): during the
  /// first steps, `steps` steps per setting, try `trials` values of the
  /// reducer's bucket_cap_mb (the configured one first, then the default
  /// kDefaultBucketCapMb of distopt/buckets.hpp, 4, 1, 100 MiB), then the fastest with `overlap`
  /// flipped, then with the reducer flipped between `mean` and `hierarchical` (only for those two
  /// reducers, without `inner:`, and when the hierarchical plugin is found), and keep the fastest
  /// (DistributedOptimizer::autotune_rows). Off by default.
  struct Autotune {
    bool enabled = false;
    int64_t steps = 20;        ///< steps per setting (the first after a rebuild is not timed)
    int64_t trials = 4;        ///< bucket_cap_mb values tried, 2..5
    bool overlap = true;       ///< also try overlap flipped
    bool hierarchical = true;  ///< also try mean <-> hierarchical where it applies
  } autotune;
  /// `app:`, the embedding program's own section: any YAML, not validated by
  /// distopt (a null node when absent). Read it through Runtime::config().app.
  YAML::Node app;
  YAML::Node root;
};

/// Parse a job file. Throws ConfigError naming file:line:column for a YAML
/// syntax error, an unknown key (listing the valid keys of that section), a
/// wrong type, or a missing required key, and naming the file when it is
/// empty (no sections). Plugin options are not checked here.
JobConfig load_job_config(const std::string& path);
/// Same, from text; `name` is used in messages in place of the file name.
JobConfig parse_job_config(const std::string& yaml_text, const std::string& name = "<string>");

/// Refuse a plugins.paths entry that is not a directory: ConfigError
/// "FILE:LINE:COL: plugins.paths: 'WRITTEN' (DIR) is not a directory: WHY".
/// A directory named in the job is meant to hold plugins, so a typo must not
/// silently fall back to the default search path. distopt check,
/// distopt train and Runtime::create call it; load_job_config does not (a
/// job may be parsed on a machine other than the one that runs it).
void check_plugin_dirs(const JobConfig& cfg);

/// Options every reducer accepts in addition to its own schema (core bucketing):
/// bucket_cap_mb (double), align_bytes (int), overlap (bool); their defaults
/// are distopt/buckets.hpp's.
const std::vector<OptionSpec>& bucket_option_specs();

/// Options of the inner optimizer (`optimizer:` minus `name`) for each
/// supported name; throws ConfigError for an unknown optimizer name.
const std::vector<OptionSpec>& optimizer_option_specs(const std::string& name);

/// The fully validated instance options of a job against the registry.
struct ValidatedJob {
  Options communicator, reducer, algorithm, optimizer;
  /// The control communicator to create beside the job's (its validated
  /// options in control_options), or "" when the job's own communicator
  /// carries host memory and none was asked for (JobConfig::control_communicator).
  std::string control_name;
  Options control_options;
  /// Per `schedule:` phase: its reducer's and algorithm's options.
  struct Phase {
    Options reducer, algorithm;
  };
  std::vector<Phase> phases;
};
/// Check that each selected component exists (PluginError/ConfigError naming
/// the file, line, the name, and what is available) and validate its options.
/// Then (ABI 1.2) each selected component with a check_job sees the whole
/// validated job and may refuse it: a ConfigError "FILE:LINE:COLUMN: KEY:
/// KIND 'NAME' refuses this job: WHY" at the YAML key it names. `world_size`
/// is the number of ranks the components are told (0: cfg.world_size, as
/// `distopt check` does; Runtime passes the launcher's).
/// Each `schedule:` phase is validated and checked the same way, as the job
/// it would be with that phase's reducer and algorithm.
ValidatedJob validate_job(const JobConfig& cfg, const PluginRegistry& registry,
                          int64_t world_size = 0);

/// The job as it runs with `algorithm` and `reducer` in place of its own
/// (a schedule phase, or DistributedOptimizer::switch_to): the same file,
/// sections and marks, without `schedule:`.
JobConfig with_components(const JobConfig& cfg, const ComponentConfig& algorithm,
                          const ComponentConfig& reducer);

}  // namespace distopt
