// Private: autotuning the communication settings while training (Bagua's
// report_metrics / ask_and_update_hyperparameters, done in-process). The
// tuner tries bucket_cap_mb values for `steps` steps each, times every step
// on every rank, takes for each setting the median step time of the slowest
// rank (one MAX allreduce of the table once every setting has run; every
// rank then picks the same winner), and rebuilds the buckets with the
// fastest through the rebuild protocol that switching uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "distopt/config.hpp"

namespace distopt {
class DistributedOptimizer;
}

namespace distopt::optim {

class Autotuner {
 public:
  /// `configured`: the job's bucket_cap_mb, tried first.
  Autotuner(const JobConfig::Autotune& cfg, double configured);
  /// After every step: time it, and move to the next setting or decide.
  /// Collective when it rebuilds or decides (every rank steps alike).
  void after_step(DistributedOptimizer& opt);
  bool done() const { return done_; }
  /// The winner (valid once done).
  double chosen() const { return chosen_; }
  /// (bucket_cap_mb, median seconds per step of the slowest rank) per setting tried.
  const std::vector<std::pair<double, double>>& table() const { return table_; }
  /// A checkpoint's choice: done, with that value (applied by the caller).
  void restore(double chosen);

 private:
  void rebuild_with(DistributedOptimizer& opt, double cap_mb);
  void decide(DistributedOptimizer& opt);

  JobConfig::Autotune cfg_;
  std::vector<double> candidates_;
  size_t trial_ = 0;
  int64_t steps_in_trial_ = 0;
  std::vector<std::vector<double>> times_;  // per trial, seconds per timed step
  std::chrono::steady_clock::time_point last_;
  bool done_ = false;
  double chosen_ = 0;
  std::vector<std::pair<double, double>> table_;
};

/// Rebuild `opt` with the reducer option bucket_cap_mb = `cap_mb` (same
/// components, state kept). Collective.
void rebuild_with_bucket_cap(DistributedOptimizer& opt, double cap_mb);

}  // namespace distopt::optim
