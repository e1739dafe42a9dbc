#include "local_sgd_algorithm.hpp"

#include <ATen/core/grad_mode.h>

#include <chrono>
#include <string>

#include "distopt/sdk/optim/algorithm_args.hpp"
#include "distopt/sdk/optim/grad_clip.hpp"

namespace distopt::plugins::local_sgd {
namespace {

[[noreturn]] void fail(dopt_status st, const std::string& msg) {
  throw sdk::Error(st, "local_sgd: " + msg);
}

const std::string kStep = "local_sgd/step";

}  // namespace

void LocalSgdAlgorithm::check_job(const sdk::JobView& job) {
  const sdk::OptionsView o = job.self().options();
  if (o.get_int("warmup_steps") == 0 && !job.reducer().has_trait(DOPT_TRAIT_EXACT_MEAN))
    job.reject("reducer.name",
               "with warmup_steps: 0 local_sgd never reduces gradients, so reducer '" +
                   job.reducer().name() +
                   "' would never run; use reducer: {name: mean} or set warmup_steps > 0 "
                   "(the reducer is used during the warm-up)");
  if (job.precision_dtype() != "fp32" && !job.precision_dtype().empty())
    job.reject("precision.dtype", "local_sgd does not support mixed precision yet",
               DOPT_ERR_UNSUPPORTED);
}

LocalSgdAlgorithm::LocalSgdAlgorithm(const dopt_algorithm_args& args)
    : reducer_(args.reducer),
      comm_(args.comm),
      rank_(
          sdk::check_algorithm_args(args, "local_sgd", sdk::kNeedsComm | sdk::kNeedsReducer).rank),
      world_size_(args.common->world_size),
      params_(args, "local_sgd"),
      average_(args.buckets, args.num_buckets, params_.by_index()) {
  const sdk::OptionsView opts(args.common->options);
  warmup_ = opts.get_int("warmup_steps");
  period_ = opts.get_int("period");
  if (warmup_ < 0 || period_ < 1)
    fail(DOPT_ERR_INVALID_ARGUMENT, "warmup_steps must be >= 0 and period >= 1");
  pending_.resize(args.num_buckets);
}

LocalSgdAlgorithm::~LocalSgdAlgorithm() {
  for (auto& p : pending_) p.reset();
}

void LocalSgdAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= pending_.size())
    fail(DOPT_ERR_INVALID_ARGUMENT, "unknown bucket " + std::to_string(bucket.index));
  if (!warming_up()) return;  // a local step: this rank's own gradient
  auto& p = pending_[static_cast<size_t>(bucket.index)];
  if (p.valid())
    fail(DOPT_ERR_STATE, "bucket " + std::to_string(bucket.index) + " is ready twice in one step");
  p = reducer_.reduce(bucket);
}

void LocalSgdAlgorithm::finish_reductions() {
  try {
    for (size_t b = 0; b < pending_.size(); ++b) {
      if (!pending_[b].valid())
        fail(DOPT_ERR_STATE, "step() before bucket " + std::to_string(b) + " was ready");
      pending_[b].wait();
      pending_[b].reset();
    }
  } catch (...) {
    for (auto& p : pending_) p.reset();  // a failed step leaves no stale requests behind
    throw;
  }
}

void LocalSgdAlgorithm::average() {
  const auto t0 = std::chrono::steady_clock::now();
  bytes_ += average_.run(comm_);
  sdk::metric_add("local_sgd.wait_seconds",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  sdk::metric_add("local_sgd.averages", 1);
}

void LocalSgdAlgorithm::step() {
  at::NoGradGuard ng;
  const bool warm_up = warming_up();
  if (warm_up) finish_reductions();
  clip_and_step();
  ++step_;
  sdk::metric_add(warm_up ? "local_sgd.warmup_steps" : "local_sgd.local_steps", 1);
  // step_ - warmup_ is now the local step k just taken (when positive).
  if (!warm_up && (step_ - warmup_) % period_ == 0 && world_size_ > 1) average();
  sdk::metric_add("algorithm.steps", 1);
}

void LocalSgdAlgorithm::set_grad_clip(double max_norm) {
  grad_clip_ = sdk::checked_max_norm(max_norm, "local_sgd");
}

void LocalSgdAlgorithm::clip_and_step() {
  if (grad_clip_ > 0) {
    std::vector<at::Tensor> grads;
    for (const auto& np : params_.trainable()) grads.push_back(np.second.grad());
    sdk::clip_grad_norm(grads, grad_clip_, sdk::GradParts::per_rank);
  }
  params_.step();
}

void LocalSgdAlgorithm::set_lr(int32_t group, double lr) { params_.set_lr(group, lr); }

uint64_t LocalSgdAlgorithm::state_bytes() const { return params_.state_bytes(); }

void LocalSgdAlgorithm::save_state(sdk::StateWriter& w) {
  sdk::save_local_replica(w, params_, rank_);
  sdk::put_counter(w, kStep, step_);
}

void LocalSgdAlgorithm::load_state(const sdk::StateReader& r) {
  sdk::load_local_replica(r, params_, world_size_, "local_sgd");
  step_ = sdk::read_counter(r, kStep, step_);
}

}  // namespace distopt::plugins::local_sgd
