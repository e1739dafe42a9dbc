// template_sgd: the smallest useful algorithm plugin. Every bucket is handed
// to the job's reducer as soon as backward completes it; step() waits for
// the reductions and applies plain SGD, p -= lr * mean_grad, to every
// parameter. Copy this folder to start a plugin of your own.
#include <vector>

#include "distopt/sdk/sdk.hpp"
#include "distopt/sdk/tensor.hpp"

namespace {

class TemplateSgd : public distopt::sdk::Algorithm {
 public:
  explicit TemplateSgd(const dopt_algorithm_args& args) : reducer_(args.reducer) {
    distopt::sdk::OptionsView opts(args.common->options);
    lr_ = opts.get_double("lr");
    for (size_t b = 0; b < args.num_buckets; ++b) buckets_.push_back(&args.buckets[b]);
    pending_.resize(args.num_buckets);
    for (size_t i = 0; i < args.num_params; ++i) {
      const dopt_param& p = args.params[i];
      if (!p.requires_grad || !p.grad) continue;
      // Non-owning views: updating them updates the application's parameters.
      params_.push_back(distopt::sdk::as_tensor(*p.data));
      grads_.push_back(distopt::sdk::as_tensor(*p.grad));
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
    for (size_t i = 0; i < params_.size(); ++i) params_[i].add_(grads_[i], -lr_);
  }

  void set_lr(int32_t, double lr) override { lr_ = lr; }
  uint64_t state_bytes() const override { return 0; }  // plain SGD keeps no state

  // Checkpoints (ABI 1.1, distopt/state.h). The host saves the parameters;
  // plain SGD keeps no other state (lr_ comes from options and set_lr).
  // A stateful algorithm puts each rank's state here, e.g. a momentum
  // buffer under "optimizer/<param name>/momentum_buffer" with
  // distopt::sdk::put_whole (distopt/sdk/tensor_state.hpp), and reads it back
  // in load_state with distopt::sdk::read_into. The SDK's defaults refuse
  // with UNSUPPORTED, so a plugin never writes an incomplete checkpoint by
  // accident: even a stateless one overrides both.
  void save_state(distopt::sdk::StateWriter&) override {}
  void load_state(const distopt::sdk::StateReader&) override {}

 private:
  distopt::sdk::ReducerView reducer_;
  double lr_ = 0.1;
  std::vector<const dopt_bucket*> buckets_;
  std::vector<distopt::sdk::ReduceHandle> pending_;
  std::vector<at::Tensor> params_, grads_;
};

constexpr dopt_option_spec kOptions[] = {
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "lr", DOPT_OPTION_DOUBLE, "0.1", 0, 10, nullptr,
     "learning rate of the plain SGD update"},
};

}  // namespace

DOPT_PLUGIN("template_sgd", "0.1.0",
            DOPT_COMPONENT(TemplateSgd, "template_sgd", "0.1.0",
                           "template: reduce every bucket, then plain SGD", kOptions))
