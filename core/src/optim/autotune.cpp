// The autotuner of autotune.hpp.
#include "optim/autotune.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "base/services.hpp"
#include "distopt/buckets.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"

namespace distopt::optim {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string describe(const AutotuneSetting& s) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "bucket_cap_mb %g, overlap %s%s", s.bucket_cap_mb,
                s.overlap ? "on" : "off", s.hierarchical ? ", hierarchical" : "");
  return buf;
}

}  // namespace

Autotuner::Autotuner(const JobConfig::Autotune& cfg, ComponentChoice base,
                     std::optional<ComponentChoice> flat_or_hier)
    : cfg_(cfg), base_(std::move(base)), flipped_(std::move(flat_or_hier)) {
  base_hierarchical_ = base_.reducer.name == "hierarchical";
  current_.bucket_cap_mb = base_.reducer_options->get_double("bucket_cap_mb");
  current_.overlap = base_.reducer_options->get_bool("overlap");
  current_.hierarchical = base_hierarchical_;
  for (double c : {current_.bucket_cap_mb, kDefaultBucketCapMb, 4.0, 1.0, 100.0}) {
    AutotuneSetting s = current_;
    s.bucket_cap_mb = c;
    if (queue_.size() < static_cast<size_t>(cfg_.trials) &&
        std::find(queue_.begin(), queue_.end(), s) == queue_.end())
      queue_.push_back(s);
  }
  std::reverse(queue_.begin(), queue_.end());  // run from the back
  rows_.push_back({queue_.back(), {}, -1});
  queue_.pop_back();
  last_ = std::chrono::steady_clock::now();
}

void Autotuner::apply(DistributedOptimizer& opt, const AutotuneSetting& s) {
  DistributedOptimizer::Impl& m = Access::of(opt);
  const ComponentChoice& from = s.hierarchical == base_hierarchical_ ? base_ : *flipped_;
  ComponentChoice c = from;
  c.reducer_options = std::make_shared<Options>(
      from.reducer_options->with("bucket_cap_mb", s.bucket_cap_mb).with("overlap", s.overlap));
  OptimizerBuild b = m.build;
  use_components(b, c);
  rebuild(opt, std::move(b), nullptr, "autotune");
  current_ = s;
}

void Autotuner::restore(DistributedOptimizer& opt, const AutotuneSetting& chosen) {
  AutotuneSetting s = chosen;
  if (s.hierarchical != base_hierarchical_ && !flipped_) s.hierarchical = base_hierarchical_;
  if (s != current_) apply(opt, s);
  rows_.clear();
  queue_.clear();
  done_ = true;
  chosen_ = s;
}

std::vector<AutotuneRow> Autotuner::table() const {
  std::vector<AutotuneRow> t;
  if (!done_) return t;
  for (const Row& r : rows_) t.push_back({r.setting, r.slowest});
  return t;
}

void Autotuner::after_step(DistributedOptimizer& opt) {
  if (done_) return;
  const auto now = std::chrono::steady_clock::now();
  // The first step of a setting pays its rebuild and first-touch costs.
  if (steps_in_trial_ > 0)
    rows_.back().seconds.push_back(std::chrono::duration<double>(now - last_).count());
  last_ = now;
  if (++steps_in_trial_ < cfg_.steps) return;
  steps_in_trial_ = 0;
  if (queue_.empty()) start_next_stage(opt);
  if (!done_) {
    rows_.push_back({queue_.back(), {}, -1});
    queue_.pop_back();
    apply(opt, rows_.back().setting);
  }
  last_ = std::chrono::steady_clock::now();  // the rebuild is not a step
}

// The slowest rank sets the pace: MAX over ranks of the medians not yet
// shared, one collective, the same table (and so the same choice) everywhere.
void Autotuner::share_medians(DistributedOptimizer& opt) {
  DistributedOptimizer::Impl& m = Access::of(opt);
  std::vector<float> med;
  for (const Row& r : rows_)
    if (r.slowest < 0) med.push_back(static_cast<float>(median(r.seconds)));
  if (m.world_size > 1)
    m.allreduce_floats(med.data(), static_cast<int64_t>(med.size()), DOPT_REDUCE_MAX,
                       "autotune: step times, MAX");
  size_t k = 0;
  for (Row& r : rows_)
    if (r.slowest < 0) r.slowest = med[k++];
}

size_t Autotuner::best_row() const {
  size_t best = 0;
  for (size_t i = 1; i < rows_.size(); ++i)
    if (rows_[i].slowest < rows_[best].slowest) best = i;
  return best;
}

// Coordinate descent: each stage flips one setting of the best so far.
void Autotuner::start_next_stage(DistributedOptimizer& opt) {
  share_medians(opt);
  const AutotuneSetting best = rows_[best_row()].setting;
  while (queue_.empty() && stage_ < 2) {
    ++stage_;
    AutotuneSetting s = best;
    if (stage_ == 1 && cfg_.overlap) {
      s.overlap = !s.overlap;
      queue_.push_back(s);
    } else if (stage_ == 2 && cfg_.hierarchical && flipped_) {
      s.hierarchical = !s.hierarchical;
      queue_.push_back(s);
    }
  }
  if (!queue_.empty()) return;
  done_ = true;
  chosen_ = best;
  if (chosen_ != current_) apply(opt, chosen_);
  log_decision(opt);
}

void Autotuner::log_decision(DistributedOptimizer& opt) const {
  DistributedOptimizer::Impl& m = Access::of(opt);
  std::string text;
  char ms[32];
  for (const Row& r : rows_) {
    std::snprintf(ms, sizeof ms, ": %.2f ms/step", 1e3 * r.slowest);
    text += (text.empty() ? "" : "; ") + describe(r.setting) + ms;
  }
  log(m.build.common.rank == 0 ? DOPT_LOG_INFO : DOPT_LOG_DEBUG, "autotune",
      text + " -> " + describe(chosen_) + " (" + std::to_string(m.buckets->num_buckets()) +
          (m.buckets->num_buckets() == 1 ? " bucket)" : " buckets)"));
}

}  // namespace distopt::optim
