// The smallest useful plugin with two components; copy this folder to start
// one of your own.
//
// template_mean (reducer): averages each gradient bucket over the ranks with
// one in-place allreduce, and counts the bytes it sends.
// template_sgd (algorithm): hands every bucket to the job's reducer as soon
// as backward completes it; step() waits for the reductions and applies
// plain SGD, p -= lr * grad, with the learning rate of the job's `optimizer:`
// section (and of each parameter group), so the job file says it once.
//
// ABI 1.5: template_sgd supports the job's optimizer.grad_clip by overriding
// set_grad_clip and clipping in step(), between the reduction and the
// update, with sdk::clip_grad_norm (distopt/sdk/optim/grad_clip.hpp): every rank
// holds the whole reduced gradient here (GradParts::replicated); an
// algorithm that shards the gradient passes the parts it owns with
// GradParts::sharded and its communicator (one scalar allreduce). Without
// the override the SDK refuses a job with grad_clip > 0, naming the plugin.
// Learning-rate schedules need nothing: the host calls set_lr every step.
//
// Two ABI 1.2 entry points, both optional static members found by
// DOPT_COMPONENT: template_mean declares `traits` (it computes the exact
// mean, which algorithms that average gradients themselves may rely on), and
// template_sgd's check_job refuses a job whose optimizer is not sgd at
// `distopt check` time, pointing at optimizer.name in the YAML, before any
// rank starts.
//
// No std::filesystem (nor std::pmr, floating-point to_chars/from_chars,
// <chrono> time zones) in a plugin: PyTorch's libtorch exports its own copies
// of these and a plugin's calls would bind to them (share/doc/distopt/DESIGN.md says more;
// check_symbols.sh checks the built plugin). Use POSIX or Boost.Filesystem.
#include <memory>
#include <string>
#include <vector>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/optim/algorithm_args.hpp"
#include "distopt/sdk/optim/grad_clip.hpp"
#include "distopt/sdk/sdk.hpp"

namespace {

namespace sdk = distopt::sdk;

// ---- reducer ----

// The reducer's request is the communicator's: done when the allreduce is.
class AllreduceRequest : public sdk::Request {
 public:
  explicit AllreduceRequest(sdk::CommHandle h) : h_(std::move(h)) {}
  bool test() override { return h_.test(); }
  bool wait(int64_t timeout_ms) override {
    h_.wait(timeout_ms);  // throws on failure or timeout, with the detail
    return true;
  }

 private:
  sdk::CommHandle h_;
};

class TemplateMean : public sdk::Reducer {
 public:
  // A plain allreduce average, whatever the options: say so (distopt/abi.h).
  static constexpr uint32_t traits = DOPT_TRAIT_EXACT_MEAN;

  TemplateMean(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket*, size_t)
      : comm_(comm), world_size_(args.world_size) {}

  std::unique_ptr<sdk::Request> reduce(const dopt_bucket& bucket) override {
    auto h = comm_.allreduce(*bucket.flat, *bucket.flat, DOPT_REDUCE_AVG);
    bytes_sent_ += sdk::ring_allreduce_bytes(sdk::dl_nbytes(*bucket.flat), world_size_);
    return std::make_unique<AllreduceRequest>(std::move(h));
  }
  uint64_t bytes_sent() const override { return bytes_sent_; }
  // Stateless: nothing to checkpoint (the SDK's defaults refuse, so even a
  // stateless component says so explicitly).
  void save_state(sdk::StateWriter&) override {}
  void load_state(const sdk::StateReader&) override {}

 private:
  sdk::CommView comm_;
  int32_t world_size_;
  uint64_t bytes_sent_ = 0;  // reduce() runs on one thread at a time
};

// ---- algorithm ----

class TemplateSgd : public sdk::Algorithm {
 public:
  // Called with the whole validated job before anything is created (`distopt
  // check`, and every rank before the rendezvous). job.reject() names the
  // YAML key; the host reports it as FILE:LINE:COLUMN: optimizer.name: ...
  static void check_job(const sdk::JobView& job) {
    if (job.optimizer_name() != "sgd")
      job.reject("optimizer.name",
                 "template_sgd applies plain SGD: optimizer.name must be sgd, got " +
                     job.optimizer_name());
  }

  explicit TemplateSgd(const dopt_algorithm_args& args) : reducer_(args.reducer) {
    // The checks every algorithm starts with (common args, rank in world,
    // arrays, group indices), and the reducer this one hands buckets to.
    sdk::check_algorithm_args(args, "template_sgd", sdk::kNeedsReducer);
    // The same rule for hosts older than ABI 1.2, which never call check_job.
    if (std::string(args.optimizer_name) != "sgd")
      throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                       std::string("template_sgd applies plain SGD: optimizer.name must be sgd, "
                                   "got ") +
                           args.optimizer_name);
    const double lr = sdk::OptionsView(args.optimizer_options).get_double("lr");
    for (size_t g = 0; g < args.num_groups; ++g)  // a negative group lr inherits
      group_lr_.push_back(args.groups[g].lr >= 0 ? args.groups[g].lr : lr);
    for (size_t b = 0; b < args.num_buckets; ++b) buckets_.push_back(&args.buckets[b]);
    pending_.resize(args.num_buckets);
    for (size_t i = 0; i < args.num_params; ++i) {
      const dopt_param& p = args.params[i];
      if (!p.requires_grad || !p.grad) continue;
      // Non-owning views: updating them updates the application's parameters.
      params_.push_back({sdk::as_tensor(*p.data), sdk::as_tensor(*p.grad), p.group});
    }
  }

  void on_bucket_ready(const dopt_bucket& bucket) override {
    pending_.at(static_cast<size_t>(bucket.index)) = reducer_.reduce(*buckets_[bucket.index]);
  }

  void step() override {
    for (auto& r : pending_) {
      r.wait();
      r.reset();
    }
    at::NoGradGuard no_grad;
    if (max_norm_ > 0) {
      std::vector<at::Tensor> grads;
      for (const Param& p : params_) grads.push_back(p.grad);
      sdk::clip_grad_norm(grads, max_norm_, sdk::GradParts::replicated);
    }
    for (Param& p : params_) p.data.add_(p.grad, -group_lr_.at(static_cast<size_t>(p.group)));
  }

  // optimizer.grad_clip (ABI 1.5): the max global L2 norm, 0 = off.
  void set_grad_clip(double max_norm) override {
    max_norm_ = sdk::checked_max_norm(max_norm, "template_sgd");
  }

  void set_lr(int32_t group, double lr) override { group_lr_.at(static_cast<size_t>(group)) = lr; }
  uint64_t state_bytes() const override { return 0; }  // plain SGD keeps no state

  // Checkpoints (ABI 1.1, distopt/state.h). The host saves the parameters and
  // the learning rates set with set_lr; plain SGD keeps no other state. A
  // stateful algorithm puts each rank's state here, e.g. a momentum buffer
  // under "optimizer/<param name>/momentum_buffer" with sdk::put_whole
  // (distopt/sdk/base/tensor_state.hpp), and reads it back with sdk::read_into.
  void save_state(sdk::StateWriter&) override {}
  void load_state(const sdk::StateReader&) override {}

 private:
  struct Param {
    at::Tensor data, grad;
    int32_t group;
  };
  sdk::ReducerView reducer_;
  std::vector<double> group_lr_;
  double max_norm_ = 0;
  std::vector<const dopt_bucket*> buckets_;
  std::vector<sdk::ReduceHandle> pending_;
  std::vector<Param> params_;
};

}  // namespace

DOPT_PLUGIN("template", "0.2.0",
            DOPT_COMPONENT(TemplateMean, "template_mean", "0.2.0",
                           "template: average each bucket with one allreduce", nullptr),
            DOPT_COMPONENT(TemplateSgd, "template_sgd", "0.2.0",
                           "template: reduce every bucket, then plain SGD at optimizer.lr",
                           nullptr))
