// Private: autotuning the communication settings while training (Bagua's
// report_metrics / ask_and_update_hyperparameters, done in-process). The
// tuner times `steps` steps per setting on every rank and searches one
// setting at a time (coordinate descent): first `trials` bucket_cap_mb
// values, then overlap flipped, then the `hierarchical` reducer flipped
// (where the job offers it, see Autotuner). After each stage one MAX
// allreduce of the new medians gives every rank the same table, so every
// rank picks the same setting; the winner is rebuilt through the rebuild
// protocol that switching uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "optim/optimizer_builder.hpp"

namespace distopt::optim {

class Autotuner {
 public:
  /// `base`: the job's components (its settings are tried first).
  /// `flat_or_hier`: the same job with the reducer flipped between `mean`
  /// and `hierarchical` (resolved and validated by the caller), or empty
  /// when that stage does not apply.
  Autotuner(const JobConfig::Autotune& cfg, ComponentChoice base,
            std::optional<ComponentChoice> flat_or_hier);
  /// After every step: time it, and move to the next setting or decide.
  /// Collective when it rebuilds or decides (every rank steps alike).
  void after_step(DistributedOptimizer& opt);
  bool done() const { return done_; }
  /// The winner (valid once done).
  const AutotuneSetting& chosen() const { return chosen_; }
  /// Every setting tried, in order, with the slowest rank's median seconds
  /// per step; empty while tuning and after restore().
  std::vector<AutotuneRow> table() const;
  /// A checkpoint's choice: rebuild `opt` with it when it is not the
  /// current setting, and tune no more. Collective when it rebuilds.
  void restore(DistributedOptimizer& opt, const AutotuneSetting& chosen);

 private:
  struct Row {
    AutotuneSetting setting;
    std::vector<double> seconds;  // this rank's timed steps
    double slowest = -1;          // median of the slowest rank, once shared
  };
  void apply(DistributedOptimizer& opt, const AutotuneSetting& s);
  void start_next_stage(DistributedOptimizer& opt);
  void share_medians(DistributedOptimizer& opt);
  size_t best_row() const;
  void log_decision(DistributedOptimizer& opt) const;

  JobConfig::Autotune cfg_;
  ComponentChoice base_;
  std::optional<ComponentChoice> flipped_;
  bool base_hierarchical_ = false;
  int stage_ = 0;                       // 0 caps, 1 overlap, 2 hierarchical
  std::vector<AutotuneSetting> queue_;  // settings of this stage not yet run
  std::vector<Row> rows_;
  AutotuneSetting current_;
  int64_t steps_in_trial_ = 0;
  std::chrono::steady_clock::time_point last_;
  bool done_ = false;
  AutotuneSetting chosen_;
};

}  // namespace distopt::optim
