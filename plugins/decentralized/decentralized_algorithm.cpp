#include "decentralized_algorithm.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "distopt/sdk/tensor.hpp"

namespace distopt::plugins::decentralized {
namespace {

[[noreturn]] void fail(dopt_status st, const std::string& msg) {
  throw sdk::Error(st, "decentralized: " + msg);
}

Topology make_topology(const sdk::OptionsView& o, int32_t world_size) {
  try {
    return Topology(o.get_string("topology"), o.get_string("neighbors"), world_size);
  } catch (const std::invalid_argument& e) {
    fail(DOPT_ERR_INVALID_ARGUMENT, e.what());
  }
}

const std::string kStep = "decentralized/step";

}  // namespace

void DecentralizedAlgorithm::check_job(const sdk::JobView& job) {
  const sdk::OptionsView o = job.self().options();
  const std::string kind = o.get_string("topology");
  try {
    Topology(kind, o.get_string("neighbors"), job.world_size());
  } catch (const std::invalid_argument& e) {
    job.reject(kind == "neighbors" ? "algorithm.options.neighbors" : "algorithm.options.topology",
               std::string(e.what()) + " (world size " + std::to_string(job.world_size()) + ")");
  }
  if (kind != "neighbors" && !o.get_string("neighbors").empty())
    job.reject("algorithm.options.neighbors", "neighbors is only read with topology: neighbors");
  if (!job.reducer().has_trait(DOPT_TRAIT_EXACT_MEAN))
    job.reject("reducer.name",
               "decentralized exchanges parameters with its neighbours and never "
               "reduces gradients, so reducer '" +
                   job.reducer().name() + "' would not apply; use reducer: {name: mean}");
  if (job.precision_dtype() != "fp32" && !job.precision_dtype().empty())
    job.reject("precision.dtype", "decentralized does not support mixed precision yet",
               DOPT_ERR_UNSUPPORTED);
}

DecentralizedAlgorithm::DecentralizedAlgorithm(const dopt_algorithm_args& args)
    : comm_(args.comm),
      rank_(args.common ? args.common->rank : 0),
      world_size_(args.common ? args.common->world_size : 0),
      topology_(make_topology(sdk::OptionsView(args.common ? args.common->options : nullptr),
                              world_size_)),
      params_(args, "decentralized") {
  if (!args.common || !args.comm.vt)
    fail(DOPT_ERR_INVALID_ARGUMENT, "needs common args and a comm");
  const sdk::OptionsView opts(args.common->options);
  interval_ = opts.get_int("communication_interval");
  overlap_ = opts.get_bool("overlap");

  for (size_t b = 0; b < args.num_buckets; ++b)
    gossip_.push_back(std::make_unique<BucketGossip>(args.buckets[b], params_.by_index()));
}

DecentralizedAlgorithm::~DecentralizedAlgorithm() { abandon_all(); }

void DecentralizedAlgorithm::start(size_t b) {
  const MixingRow row = topology_.row(rank_, step_ / interval_);
  bytes_ += gossip_[b]->start(comm_, row, static_cast<int32_t>(b));
}

void DecentralizedAlgorithm::abandon_all() {
  for (auto& g : gossip_) g->abandon();
}

void DecentralizedAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= gossip_.size())
    fail(DOPT_ERR_INVALID_ARGUMENT, "unknown bucket " + std::to_string(bucket.index));
  const size_t b = static_cast<size_t>(bucket.index);
  if (gossip_[b]->started())
    fail(DOPT_ERR_STATE, "bucket " + std::to_string(b) + " is ready twice in one step");
  if (overlap_ && world_size_ > 1 && communicates()) start(b);
}

void DecentralizedAlgorithm::step() {
  at::NoGradGuard ng;
  if (world_size_ > 1 && communicates()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (size_t b = 0; b < gossip_.size(); ++b)
        if (!gossip_[b]->started()) start(b);
      for (auto& g : gossip_) g->finish();
    } catch (...) {
      abandon_all();
      throw;
    }
    sdk::metric_add("decentralized.wait_seconds",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    sdk::metric_add("decentralized.rounds", 1);
  }
  params_.step();
  ++step_;
  sdk::metric_add("algorithm.steps", 1);
}

void DecentralizedAlgorithm::set_lr(int32_t group, double lr) { params_.set_lr(group, lr); }

uint64_t DecentralizedAlgorithm::state_bytes() const { return params_.state_bytes(); }

uint64_t DecentralizedAlgorithm::bytes_sent() const { return bytes_.load(); }

void DecentralizedAlgorithm::save_state(sdk::StateWriter& w) {
  sdk::save_local_replica(w, params_, rank_);
  sdk::put_counter(w, kStep, step_);
}

void DecentralizedAlgorithm::load_state(const sdk::StateReader& r) {
  sdk::load_local_replica(r, params_, world_size_, "decentralized");
  step_ = sdk::read_counter(r, kStep, step_);
}

}  // namespace distopt::plugins::decentralized
