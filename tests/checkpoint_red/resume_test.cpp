// Resuming training from Runtime::save_checkpoint / load_checkpoint with a
// stateful reducer (powersgd, signsgd / topk / randomk with error feedback)
// and with mixed precision's dynamic loss scale, on real processes over
// loopback (tcp + allreduce + the reducer under test).
//
// Each phase is its own set of forked ranks with a fresh Runtime, model and
// optimizer (so nothing survives a phase but the checkpoint directory):
//   full:    kSteps uninterrupted steps;
//   save:    kSaveAt steps, save_checkpoint, consolidate (the saved state);
//   resume:  a model initialised differently, load_checkpoint, consolidate
//            (the restored state), kSteps - kSaveAt steps;
//   strip + control: the checkpoint loaded into a `mean` job and saved again
//            (model, optimizer state and steps kept, reducer state gone),
//            then loaded into the reducer's job: the run whose residuals /
//            Q's / counters start from zero. It must differ from `full`,
//            which shows that `resume` matching `full` depends on them.
// Children write vectors of doubles to files; the parent (torch-free after
// the forks) compares.
#include <ATen/Parallel.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10, kBatch = 16, kSteps = 20, kSaveAt = 10;

using Net = Mlp3;  // kIn (20) -> 32 -> 16 -> kClasses (10)

// ---- results: named vectors of doubles in a file ---------------------------

using Results = std::map<std::string, std::vector<double>>;

void write_results(const std::string& path, const Results& r) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& [k, v] : r) {
    const uint64_t n = k.size(), m = v.size();
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(k.data(), static_cast<std::streamsize>(n));
    f.write(reinterpret_cast<const char*>(&m), sizeof m);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(m * 8));
  }
}
Results read_results(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  Results r;
  uint64_t n = 0, m = 0;
  while (f.read(reinterpret_cast<char*>(&n), sizeof n)) {
    std::string k(n, '\0');
    f.read(k.data(), static_cast<std::streamsize>(n));
    f.read(reinterpret_cast<char*>(&m), sizeof m);
    std::vector<double> v(m);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(m * 8));
    r[k] = std::move(v);
  }
  return r;
}

std::vector<double> as_doubles(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kDouble).contiguous().view(-1);
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// ---- one phase ---------------------------------------------------------------

struct Job {
  std::string reducer = "mean", reducer_options = "{}";
  std::string precision;  // YAML of `precision:` ("" = none)
  std::string optimizer = "{name: sgd, lr: 0.05, momentum: 0.9}";
  int world = 2;
  int inf_rank = -1, inf_step = -1;  // that rank's loss x inf at that (global) step
};

enum class Phase { kFull, kSave, kResume, kStrip };

struct PhaseSpec {
  Job job;
  Phase phase = Phase::kFull;
  std::string ckpt_in, ckpt_out;  // load from / save to
  std::string out_prefix;         // per-rank results: <prefix><rank>
  std::string log_prefix;         // per-rank stderr (logs): <prefix><rank>, "" = not captured
};

std::string yaml_of(const Job& j, int port) {
  std::ostringstream y;
  y << plugins_and_world_yaml(j.world, port) << "communicator: {name: tcp}\n"
    << "reducer: {name: " << j.reducer << ", options: " << j.reducer_options << "}\n"
    << "algorithm: {name: allreduce}\n"
    << "optimizer: " << j.optimizer << "\n";
  if (!j.precision.empty()) y << "precision: " << j.precision << "\n";
  return y.str();
}

int rank_main(const PhaseSpec& ps, int rank, int port) {
  if (!ps.log_prefix.empty()) {
    FILE* f = std::freopen((ps.log_prefix + std::to_string(rank)).c_str(), "w", stderr);
    if (!f) return 3;
  }
  at::set_num_threads(1);
  const Job& j = ps.job;
  const bool low = !j.precision.empty() && j.precision.find("bf16") != std::string::npos;
  const at::ScalarType dtype = low ? at::kBFloat16 : at::kFloat;
  // The same global batches in every phase; rank r of W takes slice
  // step * W + r.
  distopt::test::seed_cpu(1234);
  at::Tensor xs = at::randn({kSteps * j.world * kBatch, kIn});
  at::Tensor ys = at::randint(0, kClasses, {kSteps * j.world * kBatch});
  // A resumed model starts elsewhere: only the checkpoint can make it match.
  distopt::test::seed_cpu(ps.phase == Phase::kFull || ps.phase == Phase::kSave ? 42 : 4242);
  Net net;
  net->to(dtype);
  auto rt = rank_runtime(yaml_of(j, port), rank, j.world, "resume_test.yaml");
  auto opt = rt.make_optimizer(*net);
  Results res;
  auto scaler = [&](const std::string& tag) {
    const auto st = opt.loss_scale_state();
    res[tag] = {opt.loss_scale(), static_cast<double>(opt.skipped_steps()),
                static_cast<double>(st.growth_tracker), static_cast<double>(opt.steps())};
  };
  auto reducer_state = [&](const std::string& tag) {
    auto m = rt.consolidate(*net, opt);  // collective; filled on rank 0
    for (const auto& [k, t] : m)
      if (k.rfind("reducer/", 0) == 0) res[tag + k] = as_doubles(t);
  };

  int first = 0, last = kSteps;
  if (ps.phase == Phase::kSave) last = kSaveAt;
  if (ps.phase == Phase::kResume || ps.phase == Phase::kStrip) {
    auto info = rt.load_checkpoint(ps.ckpt_in, *net, opt);
    first = static_cast<int>(info.step) + static_cast<int>(opt.skipped_steps());
    res["loaded_step"] = {static_cast<double>(info.step)};
    scaler("scaler_after_load");
    reducer_state("loaded:");
  }
  if (ps.phase == Phase::kStrip) {
    rt.save_checkpoint(ps.ckpt_out, *net, opt);
    last = first;
  }
  std::vector<double> losses, scales;
  for (int step = first; step < last; ++step) {
    opt.zero_grad();
    const int64_t at_row = (static_cast<int64_t>(step) * j.world + rank) * kBatch;
    auto x = xs.narrow(0, at_row, kBatch).to(dtype);
    auto t = ys.narrow(0, at_row, kBatch);
    auto loss = at::nll_loss(at::log_softmax(net->forward(x).to(at::kFloat), 1), t);
    losses.push_back(loss.item<double>());
    if (rank == j.inf_rank && step == j.inf_step)
      loss = loss * std::numeric_limits<float>::infinity();
    opt.scale_loss(loss).backward();
    opt.step();
    scales.push_back(opt.loss_scale());
  }
  res["losses"] = losses;
  res["scales"] = scales;
  res["params"] = flat_params(net);
  if (ps.phase == Phase::kSave) {
    scaler("scaler_at_save");
    rt.save_checkpoint(ps.ckpt_out, *net, opt);
    reducer_state("saved:");
  }
  scaler("scaler_end");
  write_results(ps.out_prefix + std::to_string(rank), res);
  rt.barrier();
  return 0;
}

// Run a phase on its ranks; returns each rank's results (logs, when
// captured, stay in their files).
std::vector<Results> run_phase(const PhaseSpec& ps) {
  const int port = random_port();
  auto codes = fork_ranks(
      ps.job.world, [&](int rank) { return rank_main(ps, rank, port); }, std::chrono::seconds(120));
  std::vector<Results> out(ps.job.world);
  for (int r = 0; r < ps.job.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    out[r] = read_results(ps.out_prefix + std::to_string(r));
  }
  return out;
}

struct Dir : TempDir {
  Dir() : TempDir("distopt_red_resume") {}
};

// Phase `phase` of `job` in `d`: loads from d/<ckpt_in>, saves to
// d/<ckpt_out>, results in d/<name>.<rank>, and with `logs` each rank's
// stderr in d/<name>.log.<rank>.
PhaseSpec phase_in(const Dir& d, const Job& job, Phase phase, const std::string& name,
                   bool logs = false, const std::string& ckpt_in = "ckpt",
                   const std::string& ckpt_out = "ckpt") {
  PhaseSpec ps;
  ps.job = job;
  ps.phase = phase;
  ps.ckpt_in = d / ckpt_in;
  ps.ckpt_out = d / ckpt_out;
  ps.out_prefix = d / (name + ".");
  if (logs) ps.log_prefix = d / (name + ".log.");
  return ps;
}

// full / save / resume (+ strip / control when `control`); checks resume ==
// full bit for bit and the restored reducer state == the saved one.
struct Outcome {
  std::vector<Results> full, save, resume, control;
};
Outcome resume_case(const Job& job, const Dir& d, bool control) {
  Outcome o;
  o.full = run_phase(phase_in(d, job, Phase::kFull, "full"));
  o.save = run_phase(phase_in(d, job, Phase::kSave, "save"));
  o.resume = run_phase(phase_in(d, job, Phase::kResume, "resume"));

  for (int r = 0; r < job.world; ++r) {
    CAPTURE(r);
    // Bit for bit: the same doubles from the same float parameters.
    CHECK(o.resume[r].at("params") == o.full[r].at("params"));
    CHECK(max_abs_diff(o.resume[r].at("params"), o.full[r].at("params")) == 0.0);
    const auto& fl = o.full[r].at("losses");
    const auto& rl = o.resume[r].at("losses");
    REQUIRE(rl.size() == static_cast<size_t>(kSteps - kSaveAt));
    CHECK(std::vector<double>(fl.begin() + kSaveAt, fl.end()) == rl);
  }
  // The restored reducer state is the saved one, key for key, bit for bit.
  size_t reducer_keys = 0;
  for (const auto& [k, v] : o.save[0]) {
    if (k.rfind("saved:", 0) != 0) continue;
    const std::string key = k.substr(6);
    CAPTURE(key);
    ++reducer_keys;
    auto it = o.resume[0].find("loaded:" + key);
    REQUIRE(it != o.resume[0].end());
    CHECK(it->second == v);
  }
  size_t loaded_keys = 0;
  for (const auto& kv : o.resume[0]) loaded_keys += kv.first.rfind("loaded:", 0) == 0;
  CHECK(loaded_keys == reducer_keys);
  MESSAGE(job.reducer << " " << job.reducer_options << ": resumed run == uninterrupted " << kSteps
                      << "-step run bit for bit; " << reducer_keys
                      << " reducer state tensors restored exactly");

  if (control) {
    Job mean = job;
    mean.reducer = "mean";
    mean.reducer_options = "{}";
    run_phase(phase_in(d, mean, Phase::kStrip, "strip", false, "ckpt", "stripped"));
    o.control = run_phase(phase_in(d, job, Phase::kResume, "control", true, "stripped"));
    const double diff = max_abs_diff(o.control[0].at("params"), o.full[0].at("params"));
    MESSAGE(job.reducer << ": same checkpoint without the reducer state: parameters differ by "
                        << diff << " (max abs) after " << kSteps - kSaveAt << " steps");
    CHECK(diff > 1e-4);
    // The reducer said that its state was missing.
    CHECK(read_text(d / "control.log.0").find("checkpoint has no") != std::string::npos);
  }
  return o;
}

}  // namespace

TEST_CASE("powersgd (warm start, compression active) resumes bit-exactly from a checkpoint") {
  Dir d;
  Job j;
  j.reducer = "powersgd";
  j.reducer_options = "{rank: 2, start_iter: 3, warm_start: true}";
  auto o = resume_case(j, d, true);
  // The checkpoint holds what PowerSGD needs: residuals per rank, Q's, counters, generator.
  for (const char* k :
       {"saved:reducer/error_feedback/fc1.weight@rank0",
        "saved:reducer/error_feedback/fc1.weight@rank1", "saved:reducer/powersgd/q/fc1.weight",
        "saved:reducer/powersgd/rng", "saved:reducer/powersgd/step/fc1.bias"}) {
    CAPTURE(k);
    CHECK(o.save[0].count(k) == 1);
  }
  CHECK(o.save[0].at("saved:reducer/powersgd/step/fc1.bias") == std::vector<double>{kSaveAt});
  // Residuals differ per rank (they are rank-local).
  CHECK(o.save[0].at("saved:reducer/error_feedback/fc1.weight@rank0") !=
        o.save[0].at("saved:reducer/error_feedback/fc1.weight@rank1"));
}

TEST_CASE("signsgd, topk and randomk with error feedback resume bit-exactly") {
  for (const auto& [name, options] :
       std::vector<std::pair<std::string, std::string>>{{"signsgd", "{error_feedback: true}"},
                                                        {"topk", "{ratio: 0.05}"},
                                                        {"randomk", "{ratio: 0.05, seed: 3}"}}) {
    CAPTURE(name);
    Dir d;
    Job j;
    j.reducer = name;
    j.reducer_options = options;
    auto o = resume_case(j, d, true);
    CHECK(o.save[0].count("saved:reducer/error_feedback/fc2.weight@rank1") == 1);
    if (name == "randomk")
      CHECK(o.save[0].at("saved:reducer/randomk/step/fc2.weight") == std::vector<double>{kSaveAt});
  }
}

TEST_CASE("topk and signsgd with momentum correction resume bit-exactly (velocity saved)") {
  for (const auto& [name, options] : std::vector<std::pair<std::string, std::string>>{
           {"topk", "{ratio: 0.05, momentum: 0.9}"},
           {"signsgd", "{error_feedback: true, momentum: 0.9}"}}) {
    CAPTURE(name);
    Dir d;
    Job j;
    j.reducer = name;
    j.reducer_options = options;
    j.optimizer = "{name: sgd, lr: 0.05}";  // the momentum lives in the reducer (DGC)
    auto o = resume_case(j, d, true);
    CHECK(o.save[0].count("saved:reducer/momentum_correction/fc2.weight@rank1") == 1);
    CHECK(o.save[0].count("saved:reducer/error_feedback/fc2.weight@rank1") == 1);
  }
}

TEST_CASE(
    "an error-feedback checkpoint of 2 ranks loads into 3: residual = mean, training goes on") {
  Dir d;
  Job j;
  j.reducer = "topk";
  j.reducer_options = "{ratio: 0.05}";
  auto saved = run_phase(phase_in(d, j, Phase::kSave, "save"));
  j.world = 3;
  auto res = run_phase(phase_in(d, j, Phase::kResume, "resume3", true));
  CHECK(res[0].at("loaded_step") == std::vector<double>{kSaveAt});
  size_t checked = 0;
  for (const auto& [k, v] : saved[0]) {
    const std::string pre = "saved:reducer/error_feedback/";
    if (k.rfind(pre, 0) != 0 || k.find("@rank0") == std::string::npos) continue;
    const std::string base = k.substr(6, k.size() - 6 - 6);  // reducer/error_feedback/<p>
    CAPTURE(base);
    const auto& a = v;
    const auto& b = saved[0].at("saved:" + base + "@rank1");
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      const auto& got = res[0].at("loaded:" + base + "@rank" + std::to_string(r));
      REQUIRE(got.size() == a.size());
      double err = 0;
      for (size_t i = 0; i < a.size(); ++i)
        err = std::max(
            err, std::fabs(got[i] - static_cast<double>(static_cast<float>((a[i] + b[i]) / 2.0))));
      CHECK(err == 0.0);  // the mean, rounded once to float32
    }
    ++checked;
  }
  CHECK(checked == 6);  // 3 weights + 3 biases
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto& losses = res[r].at("losses");
    CHECK(losses.size() == static_cast<size_t>(kSteps - kSaveAt));
    for (double l : losses) CHECK(std::isfinite(l));
    for (double p : res[r].at("params")) REQUIRE(std::isfinite(p));
    CHECK(res[r].at("params") == res[0].at("params"));  // replicas agree
  }
  const std::string log = read_text(d / "resume3.log.0");
  CHECK(log.find("saved by 2 ranks, loading into 3") != std::string::npos);
  CHECK(log.find("mean of the saved ranks") != std::string::npos);
  MESSAGE("2 -> 3 ranks: residuals = mean of the 2 saved, 10 more steps, losses finite: "
          << res[0].at("losses").front() << " -> " << res[0].at("losses").back());
}

TEST_CASE(
    "bf16 + dynamic loss scale: a skipped step before the save; scaler state and run resume") {
  Dir d;
  Job j;
  j.reducer = "topk";
  j.reducer_options = "{ratio: 0.25}";
  j.precision = "{dtype: bf16, loss_scale: dynamic, init_scale: 1024, growth_interval: 4}";
  j.inf_rank = 1;
  j.inf_step = 3;  // skipped on both ranks; saved after global step 10
  auto full = run_phase(phase_in(d, j, Phase::kFull, "full"));
  auto saved = run_phase(phase_in(d, j, Phase::kSave, "save"));
  auto res = run_phase(phase_in(d, j, Phase::kResume, "resume"));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto& at_save = saved[r].at("scaler_at_save");  // scale, skipped, tracker, steps
    CHECK(at_save[1] == 1);                               // the inf step was skipped
    CHECK(at_save[3] == kSaveAt - 1);                     // steps() excludes it
    CHECK(at_save[2] > 0);  // mid-way to the next growth: the tracker matters
    CHECK(res[r].at("scaler_after_load") == at_save);
    CHECK(res[r].at("loaded_step") == std::vector<double>{kSaveAt - 1});
    // Continuing: the same scales and the same parameters as uninterrupted.
    const auto& fs_ = full[r].at("scales");
    CHECK(std::vector<double>(fs_.begin() + kSaveAt, fs_.end()) == res[r].at("scales"));
    CHECK(res[r].at("params") == full[r].at("params"));
    CHECK(res[r].at("scaler_end") == full[r].at("scaler_end"));
  }
  MESSAGE("bf16 dynamic: at save scale " << saved[0].at("scaler_at_save")[0] << ", skipped "
                                         << saved[0].at("scaler_at_save")[1] << ", tracker "
                                         << saved[0].at("scaler_at_save")[2]
                                         << "; restored exactly, end state equal");
}

TEST_CASE(
    "a powersgd checkpoint into 3 ranks with another rank option: fresh Q's, mean residuals") {
  Dir d;
  Job j;
  j.reducer = "powersgd";
  j.reducer_options = "{rank: 2, start_iter: 3}";
  auto saved = run_phase(phase_in(d, j, Phase::kSave, "save"));
  j.world = 3;
  j.reducer_options = "{rank: 3, start_iter: 3}";
  auto res = run_phase(phase_in(d, j, Phase::kResume, "resume", true));
  // Residuals (n x m, independent of the rank option) are the saved mean.
  const auto& a = saved[0].at("saved:reducer/error_feedback/fc2.weight@rank0");
  const auto& b = saved[0].at("saved:reducer/error_feedback/fc2.weight@rank1");
  const auto& got = res[0].at("loaded:reducer/error_feedback/fc2.weight@rank2");
  REQUIRE(got.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i)
    REQUIRE(got[i] == static_cast<double>(static_cast<float>((a[i] + b[i]) / 2.0)));
  // Q's have the new shape (m x 3) and are fresh.
  CHECK(res[0].at("loaded:reducer/powersgd/q/fc2.weight").size() == 32 * 3);
  // Counters carried over: compression stays on (no start_iter steps again).
  CHECK(res[0].at("loaded:reducer/powersgd/step/fc2.weight") == std::vector<double>{kSaveAt});
  for (int r = 0; r < 3; ++r)
    for (double l : res[r].at("losses")) CHECK(std::isfinite(l));
  const std::string log = read_text(d / "resume.log.0");
  CHECK(log.find("'powersgd/q/fc2.weight' was saved with another shape") != std::string::npos);
  CHECK(log.find("mean of the saved ranks") != std::string::npos);
}

// A loss scaler without a low-precision dtype ({dtype: fp32, loss_scale:
// dynamic}) is checkpointed too (the manifest records whether a scaler existed).
TEST_CASE("fp32 + dynamic loss scale: the scaler state is restored too") {
  Dir d;
  Job j;
  j.reducer = "topk";
  j.reducer_options = "{ratio: 0.25}";
  j.precision = "{dtype: fp32, loss_scale: dynamic, init_scale: 1024, growth_interval: 4}";
  j.inf_rank = 0;
  j.inf_step = 2;
  auto saved = run_phase(phase_in(d, j, Phase::kSave, "save"));
  auto res = run_phase(phase_in(d, j, Phase::kResume, "resume"));
  CHECK(saved[0].at("scaler_at_save")[1] == 1);
  CHECK(res[0].at("scaler_after_load") == saved[0].at("scaler_at_save"));
}
