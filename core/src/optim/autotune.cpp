// The autotuner of autotune.hpp.
#include "optim/autotune.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "distopt/host_api.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"

namespace distopt::optim {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

void rebuild_with_bucket_cap(DistributedOptimizer& opt, double cap_mb) {
  DistributedOptimizer::Impl& m = Access::of(opt);
  ComponentChoice c;
  c.reducer = m.build.reducer;
  c.algorithm = m.build.algorithm;
  c.reducer_options =
      std::make_shared<Options>(m.build.reducer_options->with("bucket_cap_mb", cap_mb));
  c.algorithm_options = std::make_shared<Options>(*m.build.algorithm_options);
  OptimizerBuild b = m.build;
  use_components(b, c);
  rebuild(opt, std::move(b), nullptr, "autotune");
}

Autotuner::Autotuner(const JobConfig::Autotune& cfg, double configured) : cfg_(cfg) {
  for (double c : {configured, 25.0, 4.0, 1.0, 100.0})
    if (candidates_.size() < static_cast<size_t>(cfg_.trials) &&
        std::find(candidates_.begin(), candidates_.end(), c) == candidates_.end())
      candidates_.push_back(c);
  times_.resize(candidates_.size());
  last_ = std::chrono::steady_clock::now();
}

void Autotuner::restore(double chosen) {
  done_ = true;
  chosen_ = chosen;
}

void Autotuner::after_step(DistributedOptimizer& opt) {
  if (done_) return;
  const auto now = std::chrono::steady_clock::now();
  // The first step of a setting pays its rebuild and first-touch costs.
  if (steps_in_trial_ > 0)
    times_[trial_].push_back(std::chrono::duration<double>(now - last_).count());
  last_ = now;
  if (++steps_in_trial_ < cfg_.steps) return;
  steps_in_trial_ = 0;
  if (++trial_ < candidates_.size()) {
    rebuild_with_bucket_cap(opt, candidates_[trial_]);
  } else {
    decide(opt);
  }
  last_ = std::chrono::steady_clock::now();  // the rebuild is not a step
}

void Autotuner::decide(DistributedOptimizer& opt) {
  DistributedOptimizer::Impl& m = Access::of(opt);
  // The slowest rank sets the pace: MAX over ranks, one collective for the
  // table, the same table (and so the same choice) everywhere.
  std::vector<float> med;
  for (const auto& t : times_) med.push_back(static_cast<float>(median(t)));
  if (m.world_size > 1)
    m.allreduce_floats(med.data(), static_cast<int64_t>(med.size()), DOPT_REDUCE_MAX,
                       "autotune: step times, MAX");
  size_t best = 0;
  for (size_t i = 1; i < med.size(); ++i)
    if (med[i] < med[best]) best = i;
  table_.clear();
  std::string text;
  for (size_t i = 0; i < med.size(); ++i) {
    table_.emplace_back(candidates_[i], med[i]);
    text += (i ? "; " : "") + fmt("bucket_cap_mb %g: ", candidates_[i]) +
            fmt("%.2f ms/step", 1e3 * med[i]);
  }
  done_ = true;
  chosen_ = candidates_[best];
  if (best + 1 != candidates_.size()) rebuild_with_bucket_cap(opt, chosen_);
  log(m.build.common.rank == 0 ? DOPT_LOG_INFO : DOPT_LOG_DEBUG, "autotune",
      text + " -> bucket_cap_mb " + fmt("%g", chosen_) + " (" +
          std::to_string(Access::of(opt).buckets->num_buckets()) + " buckets)");
}

}  // namespace distopt::optim
