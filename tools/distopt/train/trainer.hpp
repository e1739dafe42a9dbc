// One rank of `distopt train`: data, model, distributed optimizer, loop.
// Torch-free header so the CLI's other files need no libtorch headers.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/config.hpp"

namespace distopt::train {

/// Train the model of `cfg.train` (mlp, cnn, resnet) on its dataset
/// (Fashion-MNIST, or `synthetic`: generated on train.device from the sample
/// indices, train/synthetic.hpp) as one rank of the job (rank and world size
/// from the environment, see distopt/process.hpp).
///
/// Every rank draws the same seeded permutation each epoch and, with global
/// batch = batch_size x world size, takes slice `rank` of each global batch
/// (the last incomplete global batch is dropped), so W ranks with batch B
/// follow exactly one process with batch W*B. Rank 0 prints progress every
/// train.log_every steps, the mean train loss and test accuracy (whole test
/// set, evaluated in shards) after each epoch, and a summary; with a
/// non-empty `metrics_path` it also writes them as JSON lines (one
/// {"event":"epoch",...} per epoch and one {"event":"summary",...}).
///
/// Checkpoints (when `checkpoint_dir` is set): saved every `checkpoint_every`
/// global steps (0: only at the end of each epoch) and at the end of each
/// epoch, keeping the newest `keep`; the manifest's extra records the
/// data-loader position (epoch, samples consumed in it, global step). With
/// `resume`, training continues from the newest checkpoint there (the same
/// batches in the same order; a different world size continues at the same
/// sample, rounded down to a whole global batch) or starts afresh when there
/// is none.
///
/// Test-only fault injection: DISTOPT_FAULT_INJECT=exit:RANK:STEP makes rank
/// RANK (the rank the process started as) call _exit(137) when it reaches
/// global step STEP (1-based, counted across epochs), to test how the other
/// ranks and the launcher react; several, comma-separated, kill several;
/// DISTOPT_FAULT_INJECT=save:RANK:N kills rank RANK halfway through writing
/// its shard of its N-th checkpoint (core, checkpoint.hpp).
///
/// Elastic training (the job's `elastic:`, distopt/elastic.hpp): the ranks
/// commit in memory every elastic.commit_every steps (the data position
/// with it); when a peer dies the survivors recover and go on from the
/// last commit's epoch and step, each global batch (train.global_batch_size,
/// else batch_size x the starting ranks) split among the ranks left.
///
/// Returns 0; throws distopt::Error (DataError, ConfigError, CommError,
/// CheckpointError, ...) on failure.
struct TrainOptions {
  std::string metrics_path;    ///< JSON lines; "" = none
  std::string checkpoint_dir;  ///< "" = no checkpoints
  int64_t checkpoint_every = 0;
  int keep = 2;
  bool resume = false;
  /// With `resume`: the checkpoint to continue from (a step directory, or a
  /// checkpoint directory's newest) instead of checkpoint_dir's newest.
  std::string resume_from;
  /// `distopt eval`: restore resume_from's model, evaluate it on the test
  /// set, report, and train nothing (no checkpoint is written).
  bool evaluate_only = false;
};
int train_rank(const JobConfig& cfg, const TrainOptions& opts);

/// What `distopt train` refuses in a job before starting a rank (`distopt
/// check` runs it too for a file with a `train:` section): an unknown
/// dataset, fp16 for a model on the CPU, a Fashion-MNIST data_dir without
/// its files. Warns (log) about a `schedule:` phase that can never run.
/// Throws ConfigError naming the file and key.
void check_train_config(const JobConfig& cfg);

}  // namespace distopt::train
