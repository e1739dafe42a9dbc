#include "allreduce_algorithm.hpp"

#include <string>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/algorithm_args.hpp"
#include "distopt/sdk/optim/grad_clip.hpp"

namespace distopt::plugins::allreduce {
AllreduceAlgorithm::AllreduceAlgorithm(const dopt_algorithm_args& args)
    : reducer_(args.reducer),
      rank_(sdk::check_algorithm_args(args, "allreduce", sdk::kNeedsReducer).rank),
      world_size_(args.common->world_size),
      params_(args, "allreduce") {
  sdk::OptionsView opts(args.common->options);
  // Deprecated alias of the host's optimizer.grad_clip (ABI 1.5), kept so
  // that old YAML runs; the host's value, when set, wins.
  grad_clip_ = opts.get_double("grad_clip");
  if (grad_clip_ > 0 && rank_ == 0)
    sdk::log(DOPT_LOG_WARN, "allreduce",
             "algorithm.options.grad_clip is deprecated: write optimizer.grad_clip (the same "
             "clipping, for every algorithm)");
  grads_ = sdk::trainable_grads(args);
  average_world_ = opts.get_bool("average_world");
  divide_before_ = opts.get_bool("divide_before");
  for (size_t b = 0; b < args.num_buckets; ++b) {
    buckets_.push_back(&args.buckets[b]);
    flats_.push_back(sdk::as_tensor(*args.buckets[b].flat));
  }
  pending_.resize(args.num_buckets);
}

size_t AllreduceAlgorithm::bucket_slot(const dopt_bucket& bucket) const {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= buckets_.size())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "allreduce: unknown bucket " + std::to_string(bucket.index));
  return static_cast<size_t>(bucket.index);
}

void AllreduceAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  size_t b = bucket_slot(bucket);
  if (pending_[b].valid())
    throw sdk::Error(DOPT_ERR_STATE,
                     "allreduce: bucket " + std::to_string(b) + " is ready twice in one step");
  if (divide_before_ && world_size_ > 1) {
    at::NoGradGuard ng;
    flats_[b].div_(world_size_);
  }
  pending_[b] = reducer_.reduce(*buckets_[b]);
}

void AllreduceAlgorithm::step() {
  at::NoGradGuard ng;
  // Undo the reducer's averaging where the options ask for another scale.
  double scale = (average_world_ ? 1.0 : world_size_) * (divide_before_ ? world_size_ : 1.0);
  try {
    for (size_t b = 0; b < pending_.size(); ++b) {
      if (!pending_[b].valid())
        throw sdk::Error(DOPT_ERR_STATE,
                         "allreduce: step() before bucket " + std::to_string(b) + " was ready");
      pending_[b].wait();
      pending_[b].reset();
      if (scale != 1.0) flats_[b].mul_(scale);
    }
  } catch (...) {
    for (auto& p : pending_) p.reset();  // a failed step leaves no stale requests behind
    throw;
  }
  const double max_norm = host_grad_clip_ > 0 ? host_grad_clip_ : grad_clip_;
  if (max_norm > 0) sdk::clip_grad_norm(grads_, max_norm, sdk::GradParts::replicated);
  params_.step();
  sdk::metric_add("algorithm.steps", 1);
}

void AllreduceAlgorithm::set_grad_clip(double max_norm) {
  host_grad_clip_ = sdk::checked_max_norm(max_norm, "allreduce");
}

void AllreduceAlgorithm::set_lr(int32_t group, double lr) { params_.set_lr(group, lr); }

uint64_t AllreduceAlgorithm::state_bytes() const { return params_.state_bytes(); }

void AllreduceAlgorithm::save_state(sdk::StateWriter& w) {
  // Replicated state: every rank holds the whole logical tensor (state.h).
  sdk::StateWriter r = w.replicated(rank_);
  params_.save(r);
}

void AllreduceAlgorithm::load_state(const sdk::StateReader& r) { params_.load(r); }

}  // namespace distopt::plugins::allreduce
