// One rank of `distopt train`: data, model, distributed optimizer, loop.
// Torch-free header so the CLI's other files need no libtorch headers.
#pragma once

#include <string>

#include "distopt/config.hpp"

namespace distopt::train {

/// Train the model of `cfg.train` on Fashion-MNIST as one rank of the job
/// (rank and world size from the environment, see distopt/process.hpp).
///
/// Every rank draws the same seeded permutation each epoch and, with global
/// batch = batch_size x world size, takes slice `rank` of each global batch
/// (the last incomplete global batch is dropped), so W ranks with batch B
/// follow exactly one process with batch W*B. Rank 0 prints progress every
/// train.log_every steps, the mean train loss and test accuracy (whole 10k
/// test set, evaluated in shards) after each epoch, and a summary; with a
/// non-empty `metrics_path` it also writes them as JSON lines (one
/// {"event":"epoch",...} per epoch and one {"event":"summary",...}).
///
/// Test-only fault injection: DISTOPT_FAULT_INJECT=exit:RANK:STEP makes rank
/// RANK call _exit(137) when it reaches global step STEP (1-based, counted
/// across epochs), to test how the other ranks and the launcher react.
///
/// Returns 0; throws distopt::Error (DataError, ConfigError, CommError, ...)
/// on failure.
int train_rank(const JobConfig& cfg, const std::string& metrics_path);

}  // namespace distopt::train
