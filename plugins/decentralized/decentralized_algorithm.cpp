#include "decentralized_algorithm.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/base/traffic.hpp"
#include "distopt/sdk/optim/algorithm_args.hpp"
#include "distopt/sdk/optim/grad_clip.hpp"

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
const std::string kCopies = "low_precision/";

// Why low_precision refuses a topology, or "" when it takes it.
std::string low_precision_refusal(const std::string& topology) {
  if (topology == "shift_one")
    return "low_precision keeps copies of its neighbours' parameters current with every one of "
           "their compressed differences; shift_one's peer changes every round, so a copy would "
           "miss the differences its rank sent to others (Bagua's low-precision algorithm runs "
           "on a ring only); use topology: ring, exponential or neighbors";
  if (topology == "complete")
    return "low_precision with complete would keep a copy of every rank and receive every "
           "rank's difference each round; use topology: ring, exponential or neighbors, or "
           "drop low_precision";
  return "";
}

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
  if (o.get_bool("low_precision") && !low_precision_refusal(kind).empty())
    job.reject("algorithm.options.topology", low_precision_refusal(kind), DOPT_ERR_UNSUPPORTED);
  if (job.precision_dtype() != "fp32" && !job.precision_dtype().empty())
    job.reject("precision.dtype", "decentralized does not support mixed precision yet",
               DOPT_ERR_UNSUPPORTED);
}

DecentralizedAlgorithm::DecentralizedAlgorithm(const dopt_algorithm_args& args)
    : comm_(args.comm),
      rank_(sdk::check_algorithm_args(args, "decentralized", sdk::kNeedsComm).rank),
      world_size_(args.common->world_size),
      topology_(make_topology(sdk::OptionsView(args.common->options), world_size_)),
      params_(args, "decentralized") {
  const sdk::OptionsView opts(args.common->options);
  interval_ = opts.get_int("communication_interval");
  overlap_ = opts.get_bool("overlap");
  const std::string schedule = opts.get_string("link_schedule");
  round_.set_one_at_a_time(
      schedule == "one_at_a_time" ||
      (schedule == "auto" && args.common->local_world_size < args.common->world_size));
  low_precision_ = opts.get_bool("low_precision");
  if (args.num_buckets > 0 && args.buckets[0].flat)
    device_ = sdk::to_device(args.buckets[0].flat->device);
  const std::string kernels = opts.get_string("kernels");
  if (kernels == "host" && low_precision_ && !device_.is_cpu())
    fail(DOPT_ERR_UNSUPPORTED, "kernels: host runs the codec on CPU buckets only, these are on " +
                                   device_.str() + " (use kernels: auto or torch)");
  const bool torch_codec = kernels == "torch" || (kernels != "host" && !device_.is_cpu());
  if (!low_precision_) {
    for (size_t b = 0; b < args.num_buckets; ++b)
      gossip_.push_back(std::make_unique<BucketGossip>(args.buckets[b], params_.by_index()));
    return;
  }
  const std::string why = low_precision_refusal(topology_.kind());
  if (!why.empty()) fail(DOPT_ERR_UNSUPPORTED, why);
  const MixingRow row = topology_.row(rank_, 0);  // static topologies: every round's
  for (size_t b = 0; b < args.num_buckets; ++b)
    low_.push_back(std::make_unique<LowPrecisionGossip>(args.buckets[b], params_.by_index(), row,
                                                        torch_codec));
}

DecentralizedAlgorithm::~DecentralizedAlgorithm() { abandon_all(); }

void DecentralizedAlgorithm::start(size_t b) {
  const MixingRow row = topology_.row(rank_, step_ / interval_);
  bytes_ += gossip_[b]->start(comm_, row, static_cast<int32_t>(b), round_);
}

void DecentralizedAlgorithm::abandon_all() {
  for (auto& g : gossip_) g->abandon();
  round_.clear();
  for (auto& g : low_) g->abandon();
}

void DecentralizedAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  const size_t buckets = low_precision_ ? low_.size() : gossip_.size();
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= buckets)
    fail(DOPT_ERR_INVALID_ARGUMENT, "unknown bucket " + std::to_string(bucket.index));
  if (low_precision_) return;  // its round needs the stepped parameters
  const size_t b = static_cast<size_t>(bucket.index);
  if (gossip_[b]->started())
    fail(DOPT_ERR_STATE, "bucket " + std::to_string(b) + " is ready twice in one step");
  if (overlap_ && world_size_ > 1 && communicates()) {
    // The bucket's exchange starts, and the buckets whose neighbours are
    // ready for them go out now, while the backward computes the next ones.
    try {
      start(b);
    } catch (...) {
      abandon_all();
      throw;
    }
  }
}

void DecentralizedAlgorithm::step() {
  at::NoGradGuard ng;
  if (low_precision_) {
    low_precision_step();
    return;
  }
  if (world_size_ > 1 && communicates()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (size_t b = 0; b < gossip_.size(); ++b)
        if (!gossip_[b]->started()) start(b);
      round_.run();
      for (auto& g : gossip_) g->finish();
    } catch (...) {
      abandon_all();
      throw;
    }
    sdk::metric_add("decentralized.wait_seconds",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    sdk::metric_add("decentralized.rounds", 1);
  }
  clip_and_step();
  ++step_;
  sdk::metric_add("algorithm.steps", 1);
}

void DecentralizedAlgorithm::low_precision_round(bool sync) {
  try {
    for (size_t b = 0; b < low_.size(); ++b) {
      const int32_t tag = static_cast<int32_t>(b);
      bytes_ += sync ? low_[b]->start_sync(comm_, tag, round_) : low_[b]->start(comm_, tag, round_);
    }
    round_.run();
    for (auto& g : low_) g->finish();
  } catch (...) {
    abandon_all();
    throw;
  }
}

bool DecentralizedAlgorithm::every_rank(bool mine) {
  // On the parameters' device: a device-only communicator takes no host memory.
  at::Tensor flag = at::full({1}, mine ? 1.0f : 0.0f, at::TensorOptions().device(device_));
  sdk::DLView v(flag);
  comm_.allreduce(*v.get(), *v.get(), DOPT_REDUCE_MIN).wait();
  bytes_ += sdk::ring_allreduce_bytes(sizeof(float), world_size_);
  return flag.item<float>() == 1.0f;
}

void DecentralizedAlgorithm::low_precision_step() {
  const bool round = world_size_ > 1 && communicates();
  const auto t0 = std::chrono::steady_clock::now();
  if (round && agree_copies_) {
    agree_copies_ = false;
    const bool mine = copies_synced_;
    copies_synced_ = every_rank(mine);
    if (mine && !copies_synced_)
      sdk::log_info("decentralized",
                    "another rank's low_precision copies do not fit this job: all start again "
                    "from one float32 round");
  }
  if (round && !copies_synced_) {
    low_precision_round(true);  // x_hat = x, whole, once
    copies_synced_ = true;
  }
  const auto t1 = std::chrono::steady_clock::now();
  clip_and_step();
  if (round) {
    const auto t2 = std::chrono::steady_clock::now();
    low_precision_round(false);
    const auto t3 = std::chrono::steady_clock::now();
    sdk::metric_add("decentralized.wait_seconds",
                    std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count());
    sdk::metric_add("decentralized.rounds", 1);
  }
  ++step_;
  sdk::metric_add("algorithm.steps", 1);
}

void DecentralizedAlgorithm::set_grad_clip(double max_norm) {
  grad_clip_ = sdk::checked_max_norm(max_norm, "decentralized");
}

void DecentralizedAlgorithm::clip_and_step() {
  if (grad_clip_ > 0) {
    std::vector<at::Tensor> grads;
    for (const auto& np : params_.trainable()) grads.push_back(np.second.grad());
    sdk::clip_grad_norm(grads, grad_clip_, sdk::GradParts::per_rank);
  }
  params_.step();
}

void DecentralizedAlgorithm::set_lr(int32_t group, double lr) { params_.set_lr(group, lr); }

uint64_t DecentralizedAlgorithm::state_bytes() const {
  uint64_t copies = 0;
  for (const auto& g : low_) copies += g->state_bytes();
  return params_.state_bytes() + copies;
}

uint64_t DecentralizedAlgorithm::bytes_sent() const { return bytes_.load(); }

void DecentralizedAlgorithm::save_state(sdk::StateWriter& w) {
  sdk::save_local_replica(w, params_, rank_);
  sdk::put_counter(w, kStep, step_);
  if (!copies_synced_) return;
  at::Tensor peers = at::zeros({world_size_}, at::kLong);  // whose copies this rank saves
  for (const Link& l : topology_.row(rank_, 0).links) peers[l.peer] = 1;
  sdk::put_local(w, kCopies + "peers", peers);
  for (size_t b = 0; b < low_.size(); ++b) low_[b]->save(w, kCopies + std::to_string(b) + "/");
}

void DecentralizedAlgorithm::load_state(const sdk::StateReader& r) {
  sdk::load_local_replica(r, params_, world_size_, "decentralized");
  step_ = sdk::read_counter(r, kStep, step_);
  if (low_precision_) load_copies(r);
}

void DecentralizedAlgorithm::load_copies(const sdk::StateReader& r) {
  copies_synced_ = false;
  if (!r.find(kCopies + "0/self")) return;  // none saved: start them from a float32 round
  // Ranks may decide differently (a new neighbour for some only): the first
  // round agrees, and one rank without its copies starts them on all.
  agree_copies_ = true;
  std::string why;
  if (r.saved_world_size() != world_size_)
    why = std::to_string(r.saved_world_size()) + " ranks saved them, " +
          std::to_string(world_size_) + " now";
  if (why.empty() && r.find(kCopies + "peers")) {
    const at::Tensor saved = sdk::read_whole(r, kCopies + "peers").view({-1});
    for (const Link& l : topology_.row(rank_, 0).links)
      if (l.peer >= saved.numel() || saved[l.peer].item<int64_t>() == 0)
        why = "neighbour " + std::to_string(l.peer) + " is new";
  } else if (why.empty()) {
    why = "no list of neighbours";
  }
  for (size_t b = 0; b < low_.size() && why.empty(); ++b)
    if (!low_[b]->saved_in(r, kCopies + std::to_string(b) + "/"))
      why = "bucket " + std::to_string(b) + " has another layout";
  if (!why.empty()) {
    sdk::log_warn("decentralized", "the checkpoint's low_precision copies do not fit this job (" +
                                       why + "): they start again from one float32 round");
    return;
  }
  for (size_t b = 0; b < low_.size(); ++b) low_[b]->load(r, kCopies + std::to_string(b) + "/");
  copies_synced_ = true;
}

}  // namespace distopt::plugins::decentralized
