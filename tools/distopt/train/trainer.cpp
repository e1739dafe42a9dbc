// The training loop of `distopt train` (one rank).
#include "train/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "distopt/blas.hpp"
#include "distopt/checkpoint.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/precision.hpp"
#include "distopt/process.hpp"
#include "distopt/runtime.hpp"
#include "distopt/threads.hpp"
#include "train/dataset.hpp"
#include "train/metrics.hpp"
#include "train/models.hpp"

namespace distopt::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// DISTOPT_FAULT_INJECT=exit:RANK:STEP (test-only): {rank, step}, or {-1, -1}.
// save:RANK:N is the core's (checkpoint.hpp), comm_exit:... the tcp plugin's.
std::pair<int, int64_t> fault_injection() {
  const char* v = std::getenv("DISTOPT_FAULT_INJECT");
  if (!v || !*v || std::string(v).rfind("save:", 0) == 0 ||
      std::string(v).rfind("comm_exit:", 0) == 0)
    return {-1, -1};
  int rank = -1;
  long long step = -1;
  char tail = 0;
  if (std::sscanf(v, "exit:%d:%lld%c", &rank, &step, &tail) != 2 || rank < 0 || step < 1)
    throw ConfigError(std::string("DISTOPT_FAULT_INJECT='") + v +
                      "' is not of the form exit:RANK:STEP");
  return {rank, step};
}

// The same permutation of 0..n-1 on every rank: Fisher-Yates driven by a
// 64-bit Mersenne Twister (fully specified by the standard, unlike the
// distributions), seeded from the job seed and the epoch.
std::vector<int64_t> epoch_permutation(int64_t n, int64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937_64 gen(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull +
                      static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
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

// Test loss and accuracy over the whole test set: each rank evaluates its
// contiguous shard, the sums are allreduced.
EvalResult evaluate(Runtime& rt, Classifier& model, const at::Tensor& images_u8,
                    const at::Tensor& labels, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const int64_t n = images_u8.size(0);
  const int64_t lo = n * rt.rank() / rt.world_size();
  const int64_t hi = n * (rt.rank() + 1) / rt.world_size();
  double loss_sum = 0, correct = 0;
  for (int64_t b = lo; b < hi; b += 1000) {
    int64_t e = std::min(hi, b + 1000);
    auto x = normalise(images_u8.slice(0, b, e)).to(dtype);
    auto y = labels.slice(0, b, e);
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

int train_rank(const JobConfig& cfg, const TrainOptions& opts) {
  const TrainConfig& tc = cfg.train;
  const std::string& metrics_path = opts.metrics_path;
  if (tc.dataset != "fashion-mnist")
    throw ConfigError(cfg.path + ": train.dataset '" + tc.dataset +
                      "' is not supported (known: fashion-mnist)");
  if (tc.batch_size < 1) throw ConfigError(cfg.path + ": train.batch_size must be at least 1");
  if (tc.epochs < 1) throw ConfigError(cfg.path + ": train.epochs must be at least 1");
  check_precision_supported(cfg, /*cpu_only=*/true);  // the models run on the CPU
  const auto fault = fault_injection();
  const auto t_start = Clock::now();

  // Data first: a missing file fails every rank at once, before rendezvous.
  FashionMnist ds = load_fashion_mnist(tc.data_dir);
  const int64_t rows = ds.train.rows, cols = ds.train.cols;
  auto train_x = at::from_blob(ds.train.pixels.data(), {ds.train.count, 1, rows, cols}, at::kByte);
  auto train_y = at::from_blob(ds.train.labels.data(), {ds.train.count}, at::kByte).to(at::kLong);
  auto test_x = at::from_blob(ds.test.pixels.data(), {ds.test.count, 1, rows, cols}, at::kByte);
  auto test_y = at::from_blob(ds.test.labels.data(), {ds.test.count}, at::kByte).to(at::kLong);

  const ProcessInfo proc = detect_process_info();
  // Runtime::from_config applies the same choice; known here for the log.
  const int64_t threads =
      choose_threads_per_rank(static_cast<int>(tc.threads), proc.local_world_size);

  // Opened before the rendezvous, so a bad path fails before the other ranks wait.
  MetricsWriter metrics;
  if (proc.rank == 0 && !metrics_path.empty()) metrics = MetricsWriter(metrics_path);

  Runtime rt = Runtime::from_config(cfg);
  const int rank = rt.rank(), world = rt.world_size();
  const bool lead = rank == 0;

  auto model = make_model(tc.model, rows, cols, FashionMnist::kNumClasses, tc.seed);
  // Mixed precision: the model computes in the low dtype; the optimizer
  // keeps fp32 masters (made from these parameters in make_optimizer).
  const at::ScalarType dtype = precision_scalar_type(cfg.precision.dtype);
  if (dtype != at::kFloat) model->to(dtype);
  DistributedOptimizer opt = rt.make_optimizer(*model);

  const int64_t global_batch = tc.batch_size * world;
  // drop_last: false adds the partial global batch; its slices go to the
  // ranks in order, and a rank whose slice is empty joins (opt.join()).
  const int64_t partial = tc.drop_last ? 0 : ds.train.count % global_batch;
  int64_t steps_per_epoch = ds.train.count / global_batch + (partial > 0 ? 1 : 0);
  if (steps_per_epoch < 1)
    throw ConfigError(cfg.path + ": global batch " + std::to_string(global_batch) +
                      " (train.batch_size " + std::to_string(tc.batch_size) + " x " +
                      std::to_string(world) + " ranks) exceeds the " +
                      std::to_string(ds.train.count) + " training images");
  if (tc.max_steps > 0) steps_per_epoch = std::min(steps_per_epoch, tc.max_steps);
  const int64_t log_every = tc.log_every > 0 ? tc.log_every : 0;

  if (lead) {
    std::ostringstream os;
    os << "distopt train: " << world << " rank(s), model " << tc.model << " ("
       << parameter_count(*model) << " parameters), algorithm " << opt.algorithm_name()
       << ", reducer " << cfg.reducer.name << ", communicator " << cfg.communicator.name
       << ", optimizer " << cfg.optimizer_name << "\n"
       << "  " << tc.epochs << " epoch(s) x " << steps_per_epoch << " steps, batch "
       << tc.batch_size << " per rank (global " << global_batch << "), " << threads
       << " thread(s) per rank, " << opt.num_buckets() << " bucket(s), data " << tc.data_dir
       << "\n";
    if (partial > 0)
      os << "  drop_last: false: the last step of each epoch has " << partial
         << " sample(s); ranks without any join() and shadow it\n";
    os << "  BLAS: " << blas_description() << "\n";
    os << "  precision: " << precision_dtype_name(cfg.precision.dtype);
    if (opt.mixed_precision())
      os << " (fp32 master weights, loss scale "
         << (cfg.precision.dynamic ? "dynamic, initial " : "static ") << opt.loss_scale() << ")";
    os << "\n";
    std::cout << os.str() << std::flush;
  }

  // Resume: the newest checkpoint's parameters, optimizer state and data position.
  int64_t first_epoch = 1, first_step = 0, global_step = 0;
  if (opts.resume && !opts.checkpoint_dir.empty()) {
    if (!find_checkpoint(opts.checkpoint_dir)) {
      if (lead)
        std::cout << "resume: no checkpoint in " << opts.checkpoint_dir << ", starting afresh"
                  << std::endl;
    } else {
      CheckpointInfo ck = rt.load_checkpoint(opts.checkpoint_dir, *model, opt);
      auto num = [&](const char* key) -> int64_t {
        auto it = ck.extra.find(key);
        if (it == ck.extra.end())
          throw CheckpointError(ck.path + ": manifest extra has no '" + key +
                                "' (not written by distopt train)");
        return std::stoll(it->second);
      };
      first_epoch = num("epoch");
      const int64_t samples = num("samples_in_epoch");
      first_step = samples / global_batch;
      global_step = num("global_step");
      if (lead) {
        std::cout << "resume: " << ck.path << " (step " << ck.step << ", saved by " << ck.world_size
                  << " rank(s)): epoch " << first_epoch << ", step " << first_step << " of "
                  << steps_per_epoch << std::endl;
        if (samples % global_batch != 0)
          std::cout << "resume: " << samples % global_batch
                    << " sample(s) of a partial global batch are skipped (world size changed)"
                    << std::endl;
      }
      if (first_step >= steps_per_epoch) {
        ++first_epoch;
        first_step = 0;
      }
    }
  }
  auto save = [&](int64_t epoch, int64_t steps_done) {
    if (opts.checkpoint_dir.empty()) return;
    CheckpointExtra extra{{"epoch", std::to_string(epoch)},
                          {"samples_in_epoch", std::to_string(steps_done * global_batch)},
                          {"global_step", std::to_string(global_step)},
                          {"seed", std::to_string(tc.seed)}};
    CheckpointInfo ck = rt.save_checkpoint(opts.checkpoint_dir, *model, opt, extra, opts.keep);
    if (lead) std::cout << "checkpoint: " << ck.path << std::endl;
  };

  double train_time = 0;  // seconds inside training steps (evaluation excluded)
  EvalResult last_eval;
  double last_train_loss = 0;
  const auto t_loop = Clock::now();
  int64_t steps_run = 0;   // in this process (a resumed run skips the saved ones)
  double samples_run = 0;  // global samples of those steps
  for (int64_t epoch = first_epoch; epoch <= tc.epochs; ++epoch) {
    const auto perm = epoch_permutation(ds.train.count, tc.seed, epoch);
    model->train();
    double loss_sum = 0;
    const auto t_epoch = Clock::now();
    auto t_log = t_epoch;
    int64_t steps_since_log = 0;
    int64_t epoch_steps_run = 0;  // by this rank (fewer when it joined early)
    const int64_t start = epoch == first_epoch ? first_step : 0;
    for (int64_t step = start; step < steps_per_epoch; ++step) {
      ++global_step;
      if (fault.first == rank && fault.second == global_step) {
        std::fprintf(stderr,
                     "distopt train: DISTOPT_FAULT_INJECT: rank %d exits (137) at step %" PRId64
                     "\n",
                     rank, global_step);
        std::fflush(stderr);
        _exit(137);
      }
      const int64_t first = step * global_batch + rank * tc.batch_size;
      const int64_t mine = std::clamp<int64_t>(ds.train.count - first, 0, tc.batch_size);
      if (mine == 0) break;  // this rank's data ran out: it joins below
      auto index = at::from_blob(const_cast<int64_t*>(perm.data() + first), {mine}, at::kLong);
      auto x = normalise(train_x.index_select(0, index)).to(dtype);
      auto y = train_y.index_select(0, index);

      opt.zero_grad();
      // Softmax and loss in fp32 (as autocast does); backward from the scaled loss.
      auto loss = at::nll_loss(at::log_softmax(model->forward(x).to(at::kFloat), 1), y);
      opt.scale_loss(loss).backward();
      opt.step();
      loss_sum += loss.item<double>();
      ++steps_since_log;
      ++steps_run;
      ++epoch_steps_run;
      if (opts.checkpoint_every > 0 && global_step % opts.checkpoint_every == 0 &&
          step + 1 < steps_per_epoch)
        save(epoch, step + 1);

      if (lead && log_every > 0 && ((step + 1) % log_every == 0 || step + 1 == steps_per_epoch)) {
        double dt = seconds_since(t_log);
        std::cout << "epoch " << epoch << "/" << tc.epochs << " step " << (step + 1) << "/"
                  << steps_per_epoch << " loss " << fmt("%.4f", loss.item<double>())
                  << " samples/s "
                  << fmt("%.0f", dt > 0 ? steps_since_log * global_batch / dt : 0.0) << std::endl;
        t_log = Clock::now();
        steps_since_log = 0;
      }
    }
    // Uneven last step (drop_last: false): every rank joins, and the ranks
    // that ran out shadow the others' steps.
    if (!tc.drop_last) opt.join();
    const double epoch_train_time = seconds_since(t_epoch);
    train_time += epoch_train_time;
    save(epoch, steps_per_epoch);

    model->eval();
    const int64_t epoch_steps = steps_per_epoch - start;
    auto loss_t = at::tensor(
        {loss_sum / static_cast<double>(std::max<int64_t>(1, epoch_steps_run))}, at::kDouble);
    rt.allreduce(loss_t, /*average=*/true);
    last_train_loss = loss_t.item<double>();
    last_eval = evaluate(rt, *model, test_x, test_y, dtype);
    const double epoch_samples = static_cast<double>(
        std::min(steps_per_epoch * global_batch, ds.train.count) - start * global_batch);
    samples_run += epoch_samples;
    if (lead) {
      std::cout << "epoch " << epoch << "/" << tc.epochs << ": train loss "
                << fmt("%.4f", last_train_loss) << ", test loss " << fmt("%.4f", last_eval.loss)
                << ", test accuracy " << fmt("%.2f", 100 * last_eval.accuracy) << "% ("
                << last_eval.count << " images), " << fmt("%.2f", epoch_train_time) << " s, "
                << fmt("%.0f", epoch_samples / epoch_train_time) << " samples/s" << std::endl;
      metrics.write({{"event", "epoch"},
                     {"epoch", epoch},
                     {"steps", epoch_steps},
                     {"samples", static_cast<int64_t>(epoch_samples)},
                     {"train_loss", last_train_loss},
                     {"test_loss", last_eval.loss},
                     {"test_accuracy", last_eval.accuracy},
                     {"test_images", last_eval.count},
                     {"epoch_time_s", epoch_train_time},
                     {"samples_per_s", epoch_samples / epoch_train_time}});
    }
  }
  const double wall = seconds_since(t_loop);

  const auto sent = per_rank(rt, static_cast<double>(opt.bytes_sent()));
  const auto plain = per_rank(rt, static_cast<double>(opt.bytes_sent_plain_allreduce()));
  const auto state = per_rank(rt, static_cast<double>(opt.state_bytes()));
  const double samples = samples_run;
  const double sps = train_time > 0 ? samples / train_time : 0;
  if (lead) {
    std::cout << "summary: " << world << " rank(s), " << steps_run << " steps, "
              << static_cast<int64_t>(samples) << " samples in " << fmt("%.2f", train_time)
              << " s of training (" << fmt("%.2f", wall) << " s wall incl. evaluation, "
              << fmt("%.2f", seconds_since(t_start)) << " s incl. setup)\n"
              << "  samples/s (global): " << fmt("%.0f", sps) << "\n"
              << "  bytes sent per rank: " << join_bytes(sent)
              << " (plain allreduce: " << join_bytes(plain) << ")\n"
              << "  optimizer state per rank: " << join_bytes(state) << "\n"
              << "  precision: " << precision_dtype_name(cfg.precision.dtype)
              << ", final loss scale " << opt.loss_scale() << ", skipped steps "
              << opt.skipped_steps() << "\n"
              << "  final test accuracy: " << fmt("%.2f", 100 * last_eval.accuracy)
              << "% (train loss " << fmt("%.4f", last_train_loss) << ")" << std::endl;
    metrics.write({{"event", "summary"},
                   {"world_size", world},
                   {"model", tc.model},
                   {"algorithm", opt.algorithm_name()},
                   {"reducer", cfg.reducer.name},
                   {"communicator", cfg.communicator.name},
                   {"optimizer", cfg.optimizer_name},
                   {"epochs", tc.epochs},
                   {"steps", steps_run},
                   {"global_step", global_step},
                   {"batch_size", tc.batch_size},
                   {"global_batch", global_batch},
                   {"threads_per_rank", threads},
                   {"samples", static_cast<int64_t>(samples)},
                   {"train_time_s", train_time},
                   {"wall_time_s", wall},
                   {"total_time_s", seconds_since(t_start)},
                   {"samples_per_s", sps},
                   {"bytes_sent_per_rank", as_ints(sent)},
                   {"bytes_sent_plain_allreduce_per_rank", as_ints(plain)},
                   {"state_bytes_per_rank", as_ints(state)},
                   {"final_train_loss", last_train_loss},
                   {"final_test_loss", last_eval.loss},
                   {"final_test_accuracy", last_eval.accuracy},
                   {"dtype", precision_dtype_name(cfg.precision.dtype)},
                   {"mixed_precision", opt.mixed_precision()},
                   {"final_loss_scale", opt.loss_scale()},
                   {"skipped_steps", opt.skipped_steps()}});
  }
  rt.barrier();
  return 0;
}

}  // namespace distopt::train
