// The training loop of `distopt train` (one rank).
#include "train/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "distopt/blas.hpp"
#include "distopt/checkpoint.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/elastic.hpp"
#include "distopt/elastic_membership.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/precision.hpp"
#include "distopt/process.hpp"
#include "distopt/runtime.hpp"
#include "distopt/store.hpp"
#include "distopt/threads.hpp"
#include "train/data_plan.hpp"
#include "train/dataset.hpp"
#include "train/metrics.hpp"
#include "train/models.hpp"
#include "train/synthetic.hpp"
#include "train/user_model.hpp"

namespace distopt::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// DISTOPT_FAULT_INJECT=exit:RANK:STEP (test-only): {rank, step}, or {-1, -1}.
// save:RANK:N is the core's (checkpoint.hpp), comm_exit:... the tcp plugin's.
constexpr int kWaitJoin = -1;  // fault_injection()'s rank for wait_join:STEP

std::vector<std::pair<int, int64_t>> fault_injection() {
  const char* v = std::getenv("DISTOPT_FAULT_INJECT");
  // A restarted rank does not die again at the same step.
  if (const char* rc = std::getenv("DISTOPT_RESTART_COUNT"); rc && std::atoi(rc) > 0) return {};
  if (!v || !*v || std::string(v).rfind("save:", 0) == 0 ||
      std::string(v).rfind("comm_exit:", 0) == 0)
    return {};
  // exit:RANK:STEP, or several joined by commas (ranks dying at once).
  std::vector<std::pair<int, int64_t>> out;
  std::string all = v;
  for (size_t at = 0; at <= all.size();) {
    const size_t end = std::min(all.find(',', at), all.size());
    const std::string one = all.substr(at, end - at);
    if (one.rfind("elastic_exit:", 0) == 0) {  // the core's (elastic.cpp)
      at = end + 1;
      continue;
    }
    int rank = -1;
    long long step = -1;
    char tail = 0;
    // wait_join:STEP: before global step STEP every rank waits until a
    // process has asked to join (elastic; makes a join test deterministic).
    if (std::sscanf(one.c_str(), "wait_join:%lld%c", &step, &tail) == 1 && step >= 1) {
      out.emplace_back(kWaitJoin, step);
      at = end + 1;
      continue;
    }
    if (std::sscanf(one.c_str(), "exit:%d:%lld%c", &rank, &step, &tail) != 2 || rank < 0 ||
        step < 1)
      throw ConfigError(std::string("DISTOPT_FAULT_INJECT='") + v +
                        "' is not of the form exit:RANK:STEP[,exit:RANK:STEP...] (or "
                        "wait_join:STEP)");
    out.emplace_back(rank, step);
    at = end + 1;
  }
  return out;
}

// uint8 pixels -> normalised float images.
at::Tensor normalise(const at::Tensor& pixels_u8) {
  return (pixels_u8.to(at::kFloat).div_(255.0f).sub_(kFashionMnistMean)).div_(kFashionMnistStd);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Gather one number per rank (sum-allreduce of a one-hot vector).
std::vector<double> per_rank(Runtime& rt, double mine) {
  auto t = at::zeros({rt.world_size()}, at::kDouble);
  t[rt.rank()] = mine;
  rt.allreduce(t, /*average=*/false);
  std::vector<double> out(static_cast<size_t>(rt.world_size()));
  for (int r = 0; r < rt.world_size(); ++r) out[r] = t[r].item<double>();
  return out;
}

std::vector<int64_t> as_ints(const std::vector<double>& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}

std::string join_bytes(const std::vector<double>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format_bytes(v[i]);
  return s;
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t count = 0;
};

// The training data: Fashion-MNIST as tensors over the loaded bytes (uint8
// images, int64 labels, on the CPU; batches are moved to the device), or
// synthetic samples generated on the device from their indices.
class Data {
 public:
  explicit Data(const TrainConfig& tc) {
    if (tc.dataset == "tensors") {
      load_tensors(tc);
      return;
    }
    if (tc.dataset == "synthetic") {
      SyntheticSpec s;
      s.train_samples = tc.synthetic.train_samples;
      s.test_samples = tc.synthetic.test_samples;
      s.channels = tc.synthetic.channels;
      s.height = tc.synthetic.height;
      s.width = tc.synthetic.width;
      s.classes = tc.synthetic.classes;
      s.noise = tc.synthetic.noise;
      s.seed = tc.seed;
      syn_.emplace(s);
      channels = s.channels, rows = s.height, cols = s.width, classes = s.classes;
      train_count = s.train_samples, test_count = s.test_samples;
      description = "synthetic " + std::to_string(s.train_samples) + "+" +
                    std::to_string(s.test_samples) + " x [" + std::to_string(s.channels) + ", " +
                    std::to_string(s.height) + ", " + std::to_string(s.width) + "], " +
                    std::to_string(s.classes) + " classes, noise " + fmt("%g", s.noise);
      return;
    }
    ds_ = load_fashion_mnist(tc.data_dir);
    rows = ds_.train.rows, cols = ds_.train.cols, classes = FashionMnist::kNumClasses;
    train_count = ds_.train.count, test_count = ds_.test.count;
    description = tc.data_dir;
    train_x_ = at::from_blob(ds_.train.pixels.data(), {ds_.train.count, 1, rows, cols}, at::kByte);
    train_y_ = at::from_blob(ds_.train.labels.data(), {ds_.train.count}, at::kByte).to(at::kLong);
    test_x_ = at::from_blob(ds_.test.pixels.data(), {ds_.test.count, 1, rows, cols}, at::kByte);
    test_y_ = at::from_blob(ds_.test.labels.data(), {ds_.test.count}, at::kByte).to(at::kLong);
  }

  // Training samples `index` (int64 [B] on the CPU): images in `dtype` and
  // labels on `device`.
  std::pair<at::Tensor, at::Tensor> train_batch(const at::Tensor& index, const at::Device& device,
                                                at::ScalarType dtype) const {
    if (tensors_)
      return {tensors_->first.inputs.index_select(0, index).to(device).to(dtype),
              tensors_->first.labels.index_select(0, index).to(device)};
    if (syn_) {
      auto [x, y] = syn_->batch(index.to(device), /*test=*/false);
      return {x.to(dtype), y};
    }
    return {normalise(train_x_.index_select(0, index).to(device)).to(dtype),
            train_y_.index_select(0, index).to(device)};
  }

  // Test samples lo..hi-1, as train_batch.
  std::pair<at::Tensor, at::Tensor> test_batch(int64_t lo, int64_t hi, const at::Device& device,
                                               at::ScalarType dtype) const {
    if (tensors_)
      return {tensors_->second.inputs.slice(0, lo, hi).to(device).to(dtype),
              tensors_->second.labels.slice(0, lo, hi).to(device)};
    if (syn_) {
      auto [x, y] = syn_->batch(at::arange(lo, hi, at::TensorOptions(at::kLong).device(device)),
                                /*test=*/true);
      return {x.to(dtype), y};
    }
    return {normalise(test_x_.slice(0, lo, hi).to(device)).to(dtype),
            test_y_.slice(0, lo, hi).to(device)};
  }

  int64_t channels = 1, rows = 0, cols = 0, classes = 0, train_count = 0, test_count = 0;
  std::string description;

 private:
  // dataset: tensors: (train, test) as torch.save wrote them.
  void load_tensors(const TrainConfig& tc) {
    TensorSet tr = load_tensor_set(tc.train_tensors), te = load_tensor_set(tc.test_tensors);
    if (tr.inputs.sizes().slice(1) != te.inputs.sizes().slice(1))
      throw DataError("train.tensors: the train inputs are " + c10::str(tr.inputs.sizes()) +
                      " but the test inputs are " + c10::str(te.inputs.sizes()) +
                      " (one sample shape for both)");
    train_count = tr.inputs.size(0), test_count = te.inputs.size(0);
    if (train_count < 1 || test_count < 1)
      throw DataError("train.tensors: the train and test sets need at least one sample each");
    classes = std::max(tr.labels.max().item<int64_t>(), te.labels.max().item<int64_t>()) + 1;
    // The built-in models' view of a sample: [C, H, W], [H, W] or [F].
    const auto shape = tr.inputs.sizes().slice(1);
    channels = shape.size() == 3 ? shape[0] : 1;
    rows = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
    cols = shape.empty() ? 1 : shape.back();
    description = tc.train_tensors + " (" + std::to_string(train_count) + ") + " + tc.test_tensors +
                  " (" + std::to_string(test_count) + "), inputs " + c10::str(shape) + " " +
                  std::string(c10::toString(tr.inputs.scalar_type())) + ", " +
                  std::to_string(classes) + " classes";
    tensors_.emplace(std::move(tr), std::move(te));
  }

  FashionMnist ds_;
  std::optional<SyntheticData> syn_;
  std::optional<std::pair<TensorSet, TensorSet>> tensors_;
  at::Tensor train_x_, train_y_, test_x_, test_y_;
};

// Test loss and accuracy over the whole test set: each rank evaluates its
// contiguous shard, the sums are allreduced. With parameter sharding each
// forward gathers units (collectives), so every rank runs the same number of
// batches: a rank whose shard ran out forwards one sample and counts nothing.
EvalResult evaluate(Runtime& rt, Classifier& model, const Data& data, at::ScalarType dtype,
                    const at::Device& device, bool same_batch_count) {
  at::NoGradGuard no_grad;
  constexpr int64_t kBatch = 1000;
  const int64_t n = data.test_count;
  const int64_t world = rt.world_size();
  const int64_t lo = n * rt.rank() / world;
  const int64_t hi = n * (rt.rank() + 1) / world;
  int64_t batches = (hi - lo + kBatch - 1) / kBatch;
  if (same_batch_count) batches = ((n + world - 1) / world + kBatch - 1) / kBatch;
  double loss_sum = 0, correct = 0;
  for (int64_t k = 0; k < batches; ++k) {
    const int64_t b = lo + k * kBatch;
    const int64_t e = std::min(hi, b + kBatch);
    if (b >= e) {
      const int64_t s = std::min(lo, n - 1);
      model.forward(data.test_batch(s, s + 1, device, dtype).first);
      continue;
    }
    auto [x, y] = data.test_batch(b, e, device, dtype);
    auto logp = at::log_softmax(model.forward(x).to(at::kFloat), 1);
    loss_sum += at::nll_loss(logp, y, {}, at::Reduction::Sum).item<double>();
    correct += logp.argmax(1).eq(y).sum().item<double>();
  }
  auto t = at::tensor({loss_sum, correct, static_cast<double>(hi - lo)}, at::kDouble);
  rt.allreduce(t, /*average=*/false);
  EvalResult r;
  r.count = static_cast<int64_t>(t[2].item<double>());
  r.loss = t[0].item<double>() / std::max<double>(1, r.count);
  r.accuracy = t[1].item<double>() / std::max<double>(1, r.count);
  return r;
}

}  // namespace

// Up-front checks of the train: section that the schema cannot express.
namespace {

// A whole run's optimizer steps: train.epochs x the steps per epoch (whole
// global batches, plus the partial one unless drop_last; max_steps caps an
// epoch), at least one per epoch.
int64_t run_optimizer_steps(const TrainConfig& tc, int64_t train_count, int64_t global_batch) {
  int64_t per_epoch =
      train_count / global_batch + (!tc.drop_last && train_count % global_batch > 0 ? 1 : 0);
  if (tc.max_steps > 0) per_epoch = std::min(per_epoch, tc.max_steps);
  return std::max<int64_t>(1, per_epoch) * tc.epochs;
}

void check_warmup_within_run(const JobConfig& cfg, int64_t total_steps) {
  if (total_steps <= cfg.lr_schedule->warmup_steps)
    throw ConfigError(cfg.path + ": optimizer.lr_schedule.warmup_steps (" +
                      std::to_string(cfg.lr_schedule->warmup_steps) + ") must be below the run's " +
                      std::to_string(total_steps) +
                      " optimizer steps (train.epochs x steps per epoch)");
}

}  // namespace

void check_train_config(const JobConfig& cfg) {
  const TrainConfig& tc = cfg.train;
  if (tc.dataset != "fashion-mnist" && tc.dataset != "synthetic" && tc.dataset != "tensors")
    throw ConfigError(cfg.path + ": train.dataset '" + tc.dataset +
                      "' is not supported (known: fashion-mnist, synthetic, tensors)");
  // Your own model and data: the files must be there before any rank starts.
  for (const auto& [key, path] :
       {std::pair<const char*, std::string>{"train.model.torchscript", tc.torchscript},
        {"train.tensors.train", tc.dataset == "tensors" ? tc.train_tensors : std::string()},
        {"train.tensors.test", tc.dataset == "tensors" ? tc.test_tensors : std::string()}}) {
    struct stat st {};
    if (!path.empty() && (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)))
      throw ConfigError(cfg.path + ": " + key + ": '" + path + "' is not a file");
  }
  if (tc.batch_size < 1) throw ConfigError(cfg.path + ": train.batch_size must be at least 1");
  if (tc.epochs < 1) throw ConfigError(cfg.path + ": train.epochs must be at least 1");
  if (cfg.elastic.enabled && !tc.drop_last)
    throw ConfigError(cfg.path +
                      ": train.drop_last: false is not supported with elastic.enabled (the "
                      "uneven last step's join has no rollback point); use drop_last: true");
  // fp16 follows the model: allowed where it runs on a CUDA device.
  check_precision_supported(cfg, /*cpu_only=*/at::Device(tc.device).is_cpu());
  if (tc.dataset == "fashion-mnist")
    if (std::string missing = fashion_mnist_missing(tc.data_dir); !missing.empty())
      throw ConfigError(cfg.path + ": train.data_dir '" + tc.data_dir + "': " + missing);
  // optimizer.lr_schedule without total_steps: its warm-up must end within
  // the run (the run's length: train.epochs x steps per epoch).
  if (cfg.lr_schedule && cfg.lr_schedule->needs_total_steps() && cfg.lr_schedule->total_steps < 0) {
    const int64_t count = tc.dataset == "synthetic" ? tc.synthetic.train_samples
                          : tc.dataset == "tensors"
                              ? load_tensor_set(tc.train_tensors).labels.size(0)
                              : fashion_mnist_train_count(tc.data_dir);
    // The launcher's ranks when started by one, else world.size.
    const ProcessInfo proc = detect_process_info();
    const int64_t world = proc.source == "default" ? cfg.world_size : proc.world_size;
    const int64_t global = tc.global_batch_size > 0 ? tc.global_batch_size : tc.batch_size * world;
    check_warmup_within_run(cfg, run_optimizer_steps(tc, count, global));
  }
  // A phase bounded by an epoch the job never reaches ends the schedule there.
  for (size_t k = 0; k + 1 < cfg.schedule.size(); ++k) {
    const int64_t until = cfg.schedule[k].until_epoch;
    if (until >= tc.epochs)
      log(DOPT_LOG_WARN, "train",
          cfg.path + ": schedule[" + std::to_string(k) + "] runs until_epoch " +
              std::to_string(until) + " but train.epochs is " + std::to_string(tc.epochs) +
              ": schedule[" + std::to_string(k + 1) + "] and later phases never run");
  }
}

namespace {

// One rank's run, in the order run() calls the steps.
class Trainer {
 public:
  Trainer(const JobConfig& cfg, const TrainOptions& opts)
      : cfg_(cfg),
        tc_(cfg.train),
        opts_(opts),
        fault_(fault_injection()),
        data_(tc_),  // a missing file fails every rank at once, before rendezvous
        proc_(detect_process_info()) {
    // Opened before the rendezvous, so a bad path fails before the other ranks wait.
    // A resumed run appends to the history its first run wrote.
    if (proc_.rank == 0 && !opts.metrics_path.empty())
      metrics_ = MetricsWriter(opts.metrics_path, /*append=*/opts.resume);
  }

  int run() {
    connect();
    plan_epochs();
    print_header();
    if (!rt_->joining()) resume();  // a joining rank takes the job's state from its peers
    if (opts_.evaluate_only) return report_evaluation("evaluated");
    if (first_epoch_ > tc_.epochs) return report_evaluation("complete");
    const auto t_loop = Clock::now();
    if (cfg_.elastic.enabled) {
      elastic_.emplace(*rt_, *model_, *opt_);
      if (elastic_->rejoined()) {
        const CheckpointExtra pos = elastic_->position();
        first_epoch_ = std::stoll(pos.at("epoch"));
        first_step_ = std::stoll(pos.at("step_in_epoch"));
        global_step_ = std::stoll(pos.at("global_step"));
        joined_global_batch_ = std::stoll(pos.at("global_batch"));  // the job's, not ours
        plan_epochs();
        std::cout << "elastic: rank " << proc_.rank << " joined as rank " << rt_->rank() << " of "
                  << rt_->world_size() << " at epoch " << first_epoch_ << " step " << first_step_
                  << std::endl;
      } else {
        elastic_->commit(position(first_epoch_, first_step_));
      }
    }
    // Elastic: a peer failure anywhere rolls back to the last commit on
    // the survivors and goes on from its data position.
    for (;;) {
      try {
        for (int64_t epoch = first_epoch_; epoch <= tc_.epochs; ++epoch) train_epoch(epoch);
        summarize(seconds_since(t_loop));
        rt_->barrier();
        return 0;
      } catch (const std::exception& e) {
        if (!elastic_ || !is_peer_failure(e)) throw;
        recover(e);
      }
    }
  }

 private:
  bool lead() const { return rt_->rank() == 0; }

  // The data position a commit records: the next step of `epoch`.
  CheckpointExtra position(int64_t epoch, int64_t step) const {
    return {{"epoch", std::to_string(epoch)},
            {"step_in_epoch", std::to_string(step)},
            {"global_step", std::to_string(global_step_)},
            {"global_batch", std::to_string(global_batch_)}};
  }

  // After a peer failure: the survivors' new membership and the commit's
  // data position; the global batch stays, the slices are the new world's.
  void recover(const std::exception& e) {
    std::cerr << "distopt train: rank " << rt_->rank() << ": " << e.what()
              << "; elastic: recovering" << std::endl;
    Elastic::Recovery r = elastic_->recover();
    first_epoch_ = std::stoll(r.position.at("epoch"));
    first_step_ = std::stoll(r.position.at("step_in_epoch"));
    global_step_ = std::stoll(r.position.at("global_step"));
    ++recoveries_;
    if (lead()) {
      std::string lost;
      for (int x : r.lost) lost += (lost.empty() ? "" : ",") + std::to_string(x);
      std::cout << "elastic: generation " << r.generation << ": " << r.world_size
                << " rank(s) go on (lost rank(s) " << lost << " of " << r.old_world_size
                << "), back at epoch " << first_epoch_ << " step " << first_step_
                << " (optimizer step " << r.step << ") after " << fmt("%.2f", r.seconds) << " s"
                << std::endl;
      metrics_.write({{"event", "recovery"},
                      {"generation", r.generation},
                      {"world_size", r.world_size},
                      {"old_world_size", r.old_world_size},
                      {"lost", r.lost},
                      {"step", r.step},
                      {"epoch", first_epoch_},
                      {"step_in_epoch", first_step_},
                      {"seconds", r.seconds}});
    }
  }

  // Rendezvous, model (in the compute dtype), distributed optimizer.
  void connect() {
    rt_.emplace(Runtime::from_config(with_schedule_length(cfg_)));
    // As Runtime sized them: by the ranks that share this rank's cores.
    threads_ = at::get_num_threads();
    // resnet's width by default: small on the CPU, ResNet-18's on a GPU.
    const int64_t width = tc_.model_width > 0 ? tc_.model_width : tc_.device == "cpu" ? 8 : 64;
    model_ = tc_.model == "torchscript" ? load_torchscript_model(tc_.torchscript)
                                        : make_model(tc_.model, data_.channels, data_.rows,
                                                     data_.cols, data_.classes, tc_.seed, width);
    // Mixed precision: the model computes in the low dtype; the optimizer
    // keeps fp32 masters (made from these parameters in make_optimizer).
    dtype_ = precision_scalar_type(cfg_.precision.dtype);
    device_ = tc_.device == "cuda" ? at::Device(at::kCUDA, static_cast<int8_t>(rt_->local_rank()))
                                   : at::Device(tc_.device);
    if (!device_.is_cpu()) model_->to(device_);
    if (dtype_ != at::kFloat) model_->to(dtype_);
    num_params_ = parameter_count(*model_);  // before zero stage 3 shards them
    opt_.emplace(rt_->make_optimizer(*model_));
  }

  // "32", or "32-33" when the global batch does not divide among the ranks.
  std::string per_rank_batch() const {
    const int64_t w = rt_->world_size(), lo = global_batch_ / w;
    return global_batch_ % w == 0 ? std::to_string(lo)
                                  : std::to_string(lo) + "-" + std::to_string(lo + 1);
  }

  // Samples per step over all ranks: train.global_batch_size, else batch_size
  // x the ranks (elastic: the starting ranks, so the batch survives a failure).
  int64_t global_batch_size(int64_t world) const {
    if (joined_global_batch_ > 0) return joined_global_batch_;
    if (tc_.global_batch_size > 0) return tc_.global_batch_size;
    return tc_.batch_size * (cfg_.elastic.enabled ? proc_.world_size : world);
  }

  // optimizer.lr_schedule without total_steps: this run's optimizer steps,
  // train.epochs x the steps per epoch plan_epochs() will find (max_steps
  // caps an epoch), counted from step 0 so a resume keeps the same length.
  JobConfig with_schedule_length(const JobConfig& cfg) const {
    JobConfig out = cfg;
    if (!out.lr_schedule || !out.lr_schedule->needs_total_steps() ||
        out.lr_schedule->total_steps >= 0)
      return out;
    out.lr_schedule->total_steps =
        run_optimizer_steps(tc_, data_.train_count, global_batch_size(proc_.world_size));
    check_warmup_within_run(out, out.lr_schedule->total_steps);
    return out;
  }

  // Steps per epoch: whole global batches, plus (drop_last: false) the
  // partial one, whose slices go to the ranks in order.
  void plan_epochs() {
    global_batch_ = global_batch_size(rt_->world_size());
    if (global_batch_ < rt_->world_size())
      throw ConfigError(cfg_.path + ": train.global_batch_size " + std::to_string(global_batch_) +
                        " is below the " + std::to_string(rt_->world_size()) +
                        " ranks (each rank needs a sample per step)");
    const EpochPlan plan =
        plan_epoch(data_.train_count, global_batch_, tc_.drop_last, tc_.max_steps);
    partial_ = plan.partial;
    steps_per_epoch_ = plan.steps;
    if (steps_per_epoch_ < 1)
      throw ConfigError(cfg_.path + ": global batch " + std::to_string(global_batch_) +
                        " (train.batch_size " + std::to_string(tc_.batch_size) + " x " +
                        std::to_string(rt_->world_size()) + " ranks) exceeds the " +
                        std::to_string(data_.train_count) + " training images");
  }

  void print_header() const {
    if (!lead()) return;
    std::ostringstream os;
    os << "distopt train: " << rt_->world_size() << " rank(s), model " << tc_.model << " ("
       << num_params_ << " parameters), algorithm " << opt_->algorithm_name() << ", reducer "
       << cfg_.reducer.name << ", communicator " << cfg_.communicator.name << ", optimizer "
       << cfg_.optimizer_name << "\n"
       << "  " << tc_.epochs << " epoch(s) x " << steps_per_epoch_ << " steps, batch "
       << per_rank_batch() << " per rank (global " << global_batch_ << "), " << threads_
       << " thread(s) per rank, " << opt_->num_buckets() << " bucket(s), data " << data_.description
       << "\n";
    if (partial_ > 0)
      os << "  drop_last: false: the last step of each epoch has " << partial_
         << " sample(s); ranks without any join() and shadow it\n";
    os << "  BLAS: " << blas_description() << "\n";
    os << "  precision: " << precision_dtype_name(cfg_.precision.dtype);
    if (opt_->mixed_precision())
      os << " (fp32 master weights, loss scale "
         << (cfg_.precision.dynamic ? "dynamic, initial " : "static ") << opt_->loss_scale() << ")";
    os << "\n";
    std::cout << os.str() << std::flush;
  }

  // --resume: the newest checkpoint's parameters, optimizer state and data position.
  void resume() {
    const std::string& from = opts_.resume_from.empty() ? opts_.checkpoint_dir : opts_.resume_from;
    if (!opts_.resume || from.empty()) return;
    if (!find_checkpoint(from)) {
      if (opts_.evaluate_only) throw CheckpointError(from + ": no checkpoint to evaluate");
      if (lead())
        std::cout << "resume: no checkpoint in " << from << ", starting afresh" << std::endl;
      return;
    }
    CheckpointInfo ck = rt_->load_checkpoint(from, *model_, *opt_);
    auto num = [&](const char* key) -> int64_t {
      auto it = ck.extra.find(key);
      if (it == ck.extra.end())
        throw CheckpointError(ck.path + ": manifest extra has no '" + key +
                              "' (not written by distopt train)");
      return std::stoll(it->second);
    };
    const int64_t saved_epoch = num("epoch");
    const int64_t samples = num("samples_in_epoch");
    if (lead() && !opts_.evaluate_only)
      metrics_.write({{"event", "resume"},
                      {"checkpoint", ck.path},
                      {"step", ck.step},
                      {"world_size", rt_->world_size()},
                      {"saved_by_world_size", ck.world_size}});
    // The saved position may be past this job's epoch (train.max_steps, or a
    // larger global batch after a world-size change): the next epoch then.
    const ResumePoint at = resume_point(saved_epoch, samples, global_batch_, steps_per_epoch_);
    first_epoch_ = at.epoch;
    first_step_ = at.step;
    global_step_ = num("global_step");
    const bool epoch_done = at.epoch_done;
    if (opts_.evaluate_only) {
      if (lead())
        std::cout << "eval: " << ck.path << " (step " << ck.step << ", saved by " << ck.world_size
                  << " rank(s))" << std::endl;
      return;
    }
    if (lead()) {
      std::cout << "resume: " << ck.path << " (step " << ck.step << ", saved by " << ck.world_size
                << " rank(s)): ";
      if (epoch_done)
        std::cout << "epoch " << saved_epoch << " is complete (" << steps_per_epoch_
                  << " step(s) per epoch here); continuing with epoch " << first_epoch_
                  << std::endl;
      else
        std::cout << "epoch " << first_epoch_ << ", step " << first_step_ << " of "
                  << steps_per_epoch_ << std::endl;
      if (at.skipped > 0)
        std::cout << "resume: " << at.skipped
                  << " sample(s) of a partial global batch are skipped (world size changed)"
                  << std::endl;
    }
  }

  void save(int64_t epoch, int64_t steps_done) {
    if (opts_.checkpoint_dir.empty()) return;
    CheckpointExtra extra{{"epoch", std::to_string(epoch)},
                          {"samples_in_epoch", std::to_string(steps_done * global_batch_)},
                          {"global_step", std::to_string(global_step_)},
                          {"seed", std::to_string(tc_.seed)}};
    CheckpointInfo ck =
        rt_->save_checkpoint(opts_.checkpoint_dir, *model_, *opt_, extra, opts_.keep);
    if (lead()) std::cout << end_progress() << "checkpoint: " << ck.path << std::endl;
  }

  // DISTOPT_FAULT_INJECT=exit:RANK:STEP (test-only).
  void maybe_die() {
    if (elastic_ && std::find(fault_.begin(), fault_.end(),
                              std::make_pair(kWaitJoin, global_step_)) != fault_.end())
      for (int i = 0; i < 2400 && rt_->store().add(membership::kJoinCount, 0) < 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // The rank the process started as: ranks are renumbered after a recovery.
    if (std::find(fault_.begin(), fault_.end(), std::make_pair(proc_.rank, global_step_)) ==
        fault_.end())
      return;
    // As a crash during the step's compute: the last commit's bytes have
    // left (they leave in the background, in well under a step) and reached
    // the buddy (an exit with unread input resets the connections, which
    // drops what the kernel still holds for sending).
    if (elastic_ && elastic_->flush(5.0)) std::this_thread::sleep_for(std::chrono::seconds(1));
    std::fprintf(stderr,
                 "distopt train: DISTOPT_FAULT_INJECT: rank %d exits (137) at step %" PRId64 "\n",
                 proc_.rank, global_step_);
    std::fflush(stderr);
    _exit(137);
  }

  // One step on this rank's slice of global batch `step`; false when the
  // slice is empty (drop_last: false, this rank's data ran out).
  bool train_step(const std::vector<int64_t>& perm, int64_t step, double& loss_out) {
    // This rank's slice of global batch `step`; its mean loss weighted by its
    // share, so the ranks' mean gradient is the batch's (data_plan.hpp).
    const RankSlice slice =
        rank_slice(global_batch_, rt_->world_size(), rt_->rank(), step, data_.train_count);
    const int64_t mine = slice.count;
    if (mine == 0) return false;
    const double weight = slice.loss_weight;
    auto index = at::from_blob(const_cast<int64_t*>(perm.data() + slice.first), {mine}, at::kLong);
    auto [x, y] = data_.train_batch(index, device_, dtype_);
    opt_->zero_grad();
    // train.grad_accumulation: K micro-batches, each loss weighted by its
    // share of the batch (their sum is the batch's mean loss); the first K-1
    // backward passes only accumulate (no_sync), the last sends.
    const int64_t k_total = micro_batches(mine, tc_.grad_accumulation);
    loss_out = 0;
    for (int64_t k = 0; k < k_total; ++k) {
      const auto [b, e] = micro_batch(mine, k_total, k);
      // Softmax and loss in fp32 (as autocast does); backward from the scaled loss.
      auto loss = at::nll_loss(at::log_softmax(model_->forward(x.slice(0, b, e)).to(at::kFloat), 1),
                               y.slice(0, b, e));
      if (k_total > 1) loss = loss * (static_cast<double>(e - b) / static_cast<double>(mine));
      if (weight != 1.0) loss = loss * weight;
      if (k + 1 < k_total) {
        auto accumulate_only = opt_->no_sync();
        opt_->scale_loss(loss).backward();
      } else {
        opt_->scale_loss(loss).backward();
      }
      loss_out += loss.item<double>();
    }
    opt_->step();
    return true;
  }

  void train_epoch(int64_t epoch) {
    opt_->set_epoch(epoch - 1);  // 0-based, as DistributedSampler: may move the schedule on
    const auto perm = epoch_permutation(data_.train_count, tc_.seed, epoch);
    model_->train();
    double loss_sum = 0;
    const auto t_epoch = Clock::now();
    auto t_log = t_epoch;
    int64_t steps_since_log = 0, steps_done = 0;  // by this rank (fewer when it joined early)
    const int64_t start = epoch == first_epoch_ ? first_step_ : 0;
    for (int64_t step = start; step < steps_per_epoch_; ++step) {
      ++global_step_;
      maybe_die();
      double loss = 0;
      if (!train_step(perm, step, loss)) break;  // it joins below
      loss_sum += loss;
      ++steps_since_log;
      ++steps_done;
      ++steps_run_;
      if (opts_.checkpoint_every > 0 && global_step_ % opts_.checkpoint_every == 0 &&
          step + 1 < steps_per_epoch_)
        save(epoch, step + 1);
      if (elastic_) elastic_->maybe_commit(position(epoch, step + 1));
      const int64_t log_every = std::max<int64_t>(0, tc_.log_every);
      if (lead() && log_every > 0 &&
          ((step + 1) % log_every == 0 || step + 1 == steps_per_epoch_)) {
        const double dt = seconds_since(t_log);
        const double sps = dt > 0 ? steps_since_log * global_batch_ / dt : 0.0;
        // The epoch's time left, at the epoch's mean step time so far.
        const double eta = seconds_since(t_epoch) / static_cast<double>(steps_done) *
                           static_cast<double>(steps_per_epoch_ - step - 1);
        std::ostringstream line;
        line << "epoch " << epoch << "/" << tc_.epochs << " step " << (step + 1) << "/"
             << steps_per_epoch_ << " loss " << fmt("%.4f", loss) << " lr "
             << fmt("%.4g", opt_->lr()) << grad_norm_since_log() << " samples/s "
             << fmt("%.0f", sps) << " eta " << fmt("%.0f", eta) << " s";
        progress_line(line.str());
        // The same figures per train.log_every steps, for tools/plot_metrics.py.
        metrics_.write({{"event", "step"},
                        {"epoch", epoch},
                        {"step_in_epoch", step + 1},
                        {"global_step", global_step_},
                        {"loss", loss},
                        {"lr", opt_->lr()},
                        {"samples_per_s", sps},
                        {"bytes_sent", static_cast<double>(opt_->bytes_sent())},
                        {"loss_scale", opt_->loss_scale()}});
        t_log = Clock::now();
        steps_since_log = 0;
      }
    }
    // Uneven last step (drop_last: false): every rank joins, and the ranks
    // that ran out shadow the others' steps.
    if (!tc_.drop_last) opt_->join();
    const double epoch_time = seconds_since(t_epoch);
    train_time_ += epoch_time;
    save(epoch, steps_per_epoch_);
    end_epoch(epoch, start, loss_sum / static_cast<double>(std::max<int64_t>(1, steps_done)),
              epoch_time);
  }

  // A step line: on a terminal, one progress line redrawn in place (the
  // epoch's result replaces it); elsewhere an ordinary line. Under a
  // launcher, DISTOPT_PROGRESS=1 (its stdout is a terminal) marks the line
  // with a leading '\r' and the launcher draws it; alone, this rank draws.
  void progress_line(const std::string& text) {
    if (progress_ == Progress::kLauncher) {
      std::cout << '\r' << text << std::endl;
    } else if (progress_ == Progress::kTerminal) {
      std::cout << "\r\x1b[K" << text << std::flush;
      progress_open_ = true;
    } else {
      std::cout << text << std::endl;
    }
  }
  // What an ordinary line starts with: the erasure of an open progress line.
  const char* end_progress() {
    if (!progress_open_) return "";
    progress_open_ = false;
    return "\r\x1b[K";
  }
  enum class Progress { kLines, kLauncher, kTerminal };
  static Progress progress_mode() {
    const char* p = std::getenv("DISTOPT_PROGRESS");
    if (p) return std::string(p) == "1" ? Progress::kLauncher : Progress::kLines;
    return ::isatty(1) == 1 ? Progress::kTerminal : Progress::kLines;
  }

  // " grad_norm X": the mean pre-clip global gradient norm (this rank's
  // algorithm's "optimizer.grad_norm" metric, reported with
  // optimizer.grad_clip) since the last call; "" when not reported.
  std::string grad_norm_since_log() {
    auto m = metrics_snapshot();
    const double sum = m["optimizer.grad_norm"], n = m["optimizer.grad_norm_steps"];
    const double d_sum = sum - norm_logged_.first, d_n = n - norm_logged_.second;
    norm_logged_ = {sum, n};
    return d_n > 0 ? " grad_norm " + fmt("%.4g", d_sum / d_n) : std::string();
  }

  // Mean train loss over ranks, test evaluation, the epoch's report.
  void end_epoch(int64_t epoch, int64_t start, double my_mean_loss, double epoch_time) {
    model_->eval();
    auto loss_t = at::tensor({my_mean_loss}, at::kDouble);
    rt_->allreduce(loss_t, /*average=*/true);
    last_train_loss_ = loss_t.item<double>();
    last_eval_ = evaluate_model();
    const int64_t epoch_steps = steps_per_epoch_ - start;
    const double samples = static_cast<double>(
        std::min(steps_per_epoch_ * global_batch_, data_.train_count) - start * global_batch_);
    samples_run_ += samples;
    if (!lead()) return;
    std::cout << end_progress() << "epoch " << epoch << "/" << tc_.epochs << ": train loss "
              << fmt("%.4f", last_train_loss_) << ", test loss " << fmt("%.4f", last_eval_.loss)
              << ", test accuracy " << fmt("%.2f", 100 * last_eval_.accuracy) << "% ("
              << last_eval_.count << " images), " << fmt("%.2f", epoch_time) << " s, "
              << fmt("%.0f", samples / epoch_time) << " samples/s" << std::endl;
    nlohmann::json event = {{"event", "epoch"},
                            {"epoch", epoch},
                            {"global_step", global_step_},
                            {"steps", epoch_steps},
                            {"samples", static_cast<int64_t>(samples)},
                            {"train_loss", last_train_loss_},
                            {"test_loss", last_eval_.loss},
                            {"test_accuracy", last_eval_.accuracy},
                            {"test_images", last_eval_.count},
                            {"epoch_time_s", epoch_time},
                            {"samples_per_s", samples / epoch_time}};
    if (consensus_distance_ >= 0) event["consensus_distance"] = consensus_distance_;
    event["lr"] = opt_->lr();  // group 0's, for the next step
    {
      auto m = metrics_snapshot();
      const double d_n = m["optimizer.grad_norm_steps"] - norm_epoch_.second;
      if (d_n > 0) event["grad_norm"] = (m["optimizer.grad_norm"] - norm_epoch_.first) / d_n;
      norm_epoch_ = {m["optimizer.grad_norm"], m["optimizer.grad_norm_steps"]};
    }
    event["algorithm"] = opt_->algorithm_name();
    event["reducer"] = opt_->reducer_name();
    if (opt_->schedule_phase() >= 0) event["schedule_phase"] = opt_->schedule_phase();
    metrics_.write(event);
  }

  // With local replicas (decentralized) the model evaluated is their mean
  // over ranks, swapped in for the evaluation; the consensus distance says
  // how far the replicas are from it.
  EvalResult evaluate_model() {
    if (!opt_->replicas_differ())
      return evaluate(*rt_, *model_, data_, dtype_, device_, opt_->shards_parameters());
    at::NoGradGuard ng;
    auto avg = opt_->average_replicas();
    consensus_distance_ = avg.consensus_distance;
    std::vector<std::pair<at::Tensor, at::Tensor>> swapped;  // (parameter, its own values)
    for (auto& p : model_->named_parameters(true))
      for (auto& [name, mean] : avg.params)
        if (name == p.key()) {
          swapped.emplace_back(p.value(), p.value().detach().clone());
          p.value().detach().copy_(mean);
        }
    EvalResult r = evaluate(*rt_, *model_, data_, dtype_, device_, opt_->shards_parameters());
    for (auto& [param, own] : swapped) param.detach().copy_(own);
    if (lead())
      std::cout << "  replicas: consensus distance " << fmt("%.3g", consensus_distance_)
                << " (mean over ranks of ||x_i - x_mean||^2; the mean model is evaluated)"
                << std::endl;
    return r;
  }

  // Nothing to train: `distopt eval`, or --resume of a run whose last epoch
  // is saved. The restored model's test figures, so the user sees what the
  // checkpoint holds.
  int report_evaluation(const std::string& why) {
    model_->eval();
    last_eval_ = evaluate_model();
    if (lead()) {
      if (why == "complete")
        std::cout << "resume: the run is complete (train.epochs = " << tc_.epochs
                  << ", optimizer step " << global_step_
                  << "); nothing to train. Raise train.epochs (or --epochs) to train on.\n";
      std::cout << "  restored model (optimizer step " << global_step_ << "): test loss "
                << fmt("%.4f", last_eval_.loss) << ", test accuracy "
                << fmt("%.2f", 100 * last_eval_.accuracy) << "% (" << last_eval_.count << " images)"
                << std::endl;
      metrics_.write({{"event", "evaluation"},
                      {"reason", why == "complete" ? "resumed a complete run" : "distopt eval"},
                      {"global_step", global_step_},
                      {"test_loss", last_eval_.loss},
                      {"test_accuracy", last_eval_.accuracy},
                      {"test_images", last_eval_.count}});
    }
    rt_->barrier();
    return 0;
  }

  // Per-rank byte and state counts (collective), then rank 0's summary.
  void summarize(double wall) {
    auto& opt = *opt_;
    const auto sent = per_rank(*rt_, static_cast<double>(opt.bytes_sent()));
    const auto plain = per_rank(*rt_, static_cast<double>(opt.bytes_sent_plain_allreduce()));
    const auto state = per_rank(*rt_, static_cast<double>(opt.state_bytes()));
    // Seconds inside opt.step(): the communication backward did not hide, and the update.
    const auto in_step = per_rank(*rt_, metrics_snapshot()["optim.step_seconds"]);
    const double sps = train_time_ > 0 ? samples_run_ / train_time_ : 0;
    if (!lead()) return;
    std::cout << "summary: " << rt_->world_size() << " rank(s), " << steps_run_ << " steps, "
              << static_cast<int64_t>(samples_run_) << " samples in " << fmt("%.2f", train_time_)
              << " s of training (" << fmt("%.2f", wall) << " s wall incl. evaluation, "
              << fmt("%.2f", seconds_since(t_start_)) << " s incl. setup)\n"
              << "  samples/s (global): " << fmt("%.0f", sps) << "\n"
              << "  bytes sent per rank: " << join_bytes(sent)
              << " (plain allreduce: " << join_bytes(plain) << ")\n"
              << "  optimizer state per rank: " << join_bytes(state) << "\n"
              << "  precision: " << precision_dtype_name(cfg_.precision.dtype)
              << ", final loss scale " << opt.loss_scale() << ", skipped steps "
              << opt.skipped_steps() << "\n"
              << "  final test accuracy: " << fmt("%.2f", 100 * last_eval_.accuracy)
              << "% (train loss " << fmt("%.4f", last_train_loss_) << ")" << std::endl;
    metrics_.write({{"event", "summary"},
                    {"world_size", rt_->world_size()},
                    {"model", tc_.model},
                    {"algorithm", opt.algorithm_name()},
                    {"reducer", cfg_.reducer.name},
                    {"communicator", cfg_.communicator.name},
                    {"optimizer", cfg_.optimizer_name},
                    {"epochs", tc_.epochs},
                    {"steps", steps_run_},
                    {"global_step", global_step_},
                    {"batch_size", tc_.batch_size},
                    {"global_batch", global_batch_},
                    {"threads_per_rank", static_cast<int64_t>(at::get_num_threads())},
                    {"samples", static_cast<int64_t>(samples_run_)},
                    {"train_time_s", train_time_},
                    {"wall_time_s", wall},
                    {"total_time_s", seconds_since(t_start_)},
                    {"samples_per_s", sps},
                    {"bytes_sent_per_rank", as_ints(sent)},
                    {"bytes_sent_plain_allreduce_per_rank", as_ints(plain)},
                    {"state_bytes_per_rank", as_ints(state)},
                    {"step_seconds_per_rank", in_step},
                    {"final_train_loss", last_train_loss_},
                    {"final_test_loss", last_eval_.loss},
                    {"final_test_accuracy", last_eval_.accuracy},
                    {"dtype", precision_dtype_name(cfg_.precision.dtype)},
                    {"mixed_precision", opt.mixed_precision()},
                    {"final_loss_scale", opt.loss_scale()},
                    {"skipped_steps", opt.skipped_steps()}});
  }

  const JobConfig& cfg_;
  const TrainConfig& tc_;
  const TrainOptions& opts_;
  const std::vector<std::pair<int, int64_t>> fault_;
  const Clock::time_point t_start_ = Clock::now();
  Data data_;
  const ProcessInfo proc_;
  int64_t threads_ = 1;  // intra-op threads per rank (connect())
  const Progress progress_ = progress_mode();
  bool progress_open_ = false;  // kTerminal: a progress line is drawn, not ended
  MetricsWriter metrics_;
  std::optional<Runtime> rt_;
  std::shared_ptr<Classifier> model_;
  int64_t num_params_ = 0;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;             // train.device
  std::optional<DistributedOptimizer> opt_;  // after rt_: destroyed first
  std::optional<Elastic> elastic_;           // elastic.enabled; borrows rt_, model_, opt_
  int64_t recoveries_ = 0;
  int64_t joined_global_batch_ = 0;  // a joining rank: the running job's global batch
  int64_t global_batch_ = 0, partial_ = 0, steps_per_epoch_ = 0;
  int64_t first_epoch_ = 1, first_step_ = 0, global_step_ = 0;
  int64_t steps_run_ = 0;   // in this process (a resumed run skips the saved ones)
  double samples_run_ = 0;  // global samples of the epochs run
  double train_time_ = 0;   // seconds inside training steps (evaluation excluded)
  EvalResult last_eval_;
  double consensus_distance_ = -1;  // local replicas only: at the last evaluation
  double last_train_loss_ = 0;
  // (sum, count) of the optimizer.grad_norm metric at the last log line / epoch end.
  std::pair<double, double> norm_logged_{0, 0}, norm_epoch_{0, 0};
};

}  // namespace

int train_rank(const JobConfig& cfg, const TrainOptions& opts) {
  check_train_config(cfg);
  if (!cfg.train.drop_last && !cfg.join.enabled) {
    JobConfig with_join = cfg;  // uneven last steps need join()
    with_join.join.enabled = true;
    return Trainer(with_join, opts).run();
  }
  return Trainer(cfg, opts).run();
}

}  // namespace distopt::train
