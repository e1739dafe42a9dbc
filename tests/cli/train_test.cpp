// `distopt train`: the real CLI training real ranks on Fashion-MNIST over
// loopback, its metrics, its failure paths.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "job_yaml.hpp"
#include "train_metrics.hpp"

using distopt::test::env_path;
using distopt::test::ProcResult;
using namespace distopt::test::cli;
using distopt::test::run_command;
using nlohmann::json;

namespace {

const char* const kData = distopt::test::kFashionMnistDir;

struct Job {
  int world = 2;
  int batch = 64;
  int max_steps = 20;
  int epochs = 1;
  std::string optimizer = "{name: sgd, lr: 0.1, momentum: 0.9}";
  std::string model = "mlp";
  double timeout_s = 30;
  bool drop_last = true;
};

// A job file whose plugins come from the build tree ($DISTOPT_PLUGIN_DIR).
// With `with_plugins` false the file names no plugin directory.
std::string write_job(const TempDir& t, const Job& j, const std::string& name = "job.yaml",
                      bool with_plugins = true) {
  distopt::test::JobYaml y = distopt::test::allreduce_job(j.world);
  y.plugins = with_plugins;
  y.timeout_s = j.timeout_s;
  y.optimizer = j.optimizer;
  distopt::test::TrainYaml& train = *y.train;
  train.model = j.model;
  train.epochs = j.epochs;
  train.batch_size = j.batch;
  train.max_steps = j.max_steps;
  train.log_every = 5;
  if (!j.drop_last) train.more = ", drop_last: false";
  return distopt::test::write_job(t.file(name), y);
}

// The epoch and summary records of a metrics file (the per-step records,
// one per train.log_every steps, left out).
std::vector<json> read_metrics(const std::string& path) {
  std::vector<json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    json j = json::parse(line);
    if (j["event"] != "step") out.push_back(std::move(j));
  }
  return out;
}

// The single process that sees what `j`'s ranks see together: the global
// batch (world x batch) in one.
Job one_process_of(const Job& j) {
  Job one = j;
  one.world = 1;
  one.batch = j.world * j.batch;
  return one;
}

struct TrainRun {
  ProcResult proc;
  std::vector<json> metrics;  // the --metrics lines
};

// `distopt train` of `j` from t/<name>.yaml, metrics in t/<name>.jsonl
// (300 s limit); REQUIREs exit code 0.
TrainRun train_ok(const TempDir& t, const Job& j, const std::string& name) {
  const std::string metrics = t.file(name + ".jsonl");
  TrainRun run;
  run.proc = run_command({cli(), "train", write_job(t, j, name + ".yaml"), "--metrics", metrics},
                         {}, std::chrono::seconds(300));
  INFO(run.proc.output);
  REQUIRE(run.proc.exit_code == 0);
  run.metrics = read_metrics(metrics);
  return run;
}

// Two runs on the same samples averaged the same way: an epoch's test loss
// equal up to float rounding, its accuracy within 5 of 10000 test images.
// (By value: operator[] of a const json must not meet a missing key.)
void check_same_epoch(json a, json b) {
  CHECK(a["test_loss"].get<double>() ==
        doctest::Approx(b["test_loss"].get<double>()).epsilon(1e-4));
  CHECK(std::abs(a["test_accuracy"].get<double>() - b["test_accuracy"].get<double>()) <= 0.0005);
}

}  // namespace

TEST_CASE("distopt train with 2 ranks trains, reports test accuracy, and writes metrics") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.max_steps = 30;
  std::string cfg = write_job(t, j);
  std::string metrics = t.file("metrics.jsonl");
  ProcResult r =
      run_command({cli(), "train", cfg, "--metrics", metrics}, {}, std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  // The command launched its own ranks: their lines carry the prefix.
  CHECK(r.output.find("[rank 0] epoch 1/1 step 5/30 loss") != std::string::npos);
  CHECK(std::regex_search(
      r.output, std::regex(R"(\[rank 0\] epoch 1/1: train loss [0-9.]+, test loss [0-9.]+, )"
                           R"(test accuracy [0-9.]+% \(10000 images\))")));
  CHECK(r.output.find("[rank 0] summary: 2 rank(s), 30 steps, 3840 samples") != std::string::npos);
  CHECK(r.output.find("final test accuracy") != std::string::npos);
  CHECK(r.output.find("[rank 1] epoch") == std::string::npos);  // only rank 0 reports

  auto m = read_metrics(metrics);
  REQUIRE(m.size() == 2);
  CHECK(m[0]["event"] == "epoch");
  CHECK(m[0]["steps"] == 30);
  CHECK(m[0]["test_images"] == 10000);
  // 30 SGD steps on 128-image global batches: far above chance (10%).
  CHECK(m[0]["test_accuracy"].get<double>() > 0.6);
  CHECK(m[0]["train_loss"].get<double>() < 2.3);
  CHECK(m[1]["event"] == "summary");
  CHECK(m[1]["world_size"] == 2);
  CHECK(m[1]["samples"] == 30 * 128);
  CHECK(m[1]["final_test_accuracy"] == m[0]["test_accuracy"]);
  REQUIRE(m[1]["bytes_sent_per_rank"].size() == 2);
  REQUIRE(m[1]["state_bytes_per_rank"].size() == 2);
  for (int r2 = 0; r2 < 2; ++r2) {
    CHECK(m[1]["bytes_sent_per_rank"][r2].get<double>() > 0);
    // SGD with momentum keeps one buffer per parameter: 535,818 floats.
    CHECK(m[1]["state_bytes_per_rank"][r2].get<double>() >= 535818.0 * 4);
  }
  CHECK(m[1]["samples_per_s"].get<double>() > 0);
}

TEST_CASE("2 ranks with batch B follow a single process with batch 2B") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job two;
  two.world = 2;
  two.batch = 32;
  two.max_steps = 25;
  TrainRun r2 = train_ok(t, two, "two");
  TrainRun r1 = train_ok(t, one_process_of(two), "one");
  CHECK(r1.proc.output.find("[rank") == std::string::npos);  // one rank: no launcher, no prefixes
  auto &a = r2.metrics, &b = r1.metrics;
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(a[1]["samples"] == b[1]["samples"]);
  // Same samples in the same order, averaged the same way: equal up to float rounding.
  CHECK(a[0]["train_loss"].get<double>() ==
        doctest::Approx(b[0]["train_loss"].get<double>()).epsilon(1e-4));
  check_same_epoch(a[0], b[0]);
}

TEST_CASE("drop_last: false: a rank without samples in the last step joins; equals 1 process") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  // 60000 images, global batch 50000: one full step, then 10000 images, all
  // in rank 0's slice (batch 25000), so rank 1 joins and shadows that step.
  // (Few large steps: over hundreds of steps float rounding alone drifts.)
  TempDir t;
  Job two;
  two.batch = 25000;
  two.max_steps = 0;
  two.epochs = 2;
  two.drop_last = false;
  TrainRun r2 = train_ok(t, two, "two");
  CHECK(r2.proc.output.find("the last step of each epoch has 10000 sample(s)") !=
        std::string::npos);
  TrainRun r1 = train_ok(t, one_process_of(two), "one");
  auto &a = r2.metrics, &b = r1.metrics;
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  CHECK(a[0]["steps"] == 2);
  CHECK(b[0]["steps"] == 2);
  CHECK(a[2]["samples"] == 120000);
  for (int e = 0; e < 2; ++e) {
    CAPTURE(e);
    check_same_epoch(a[e], b[e]);
  }
  CHECK(a[1]["test_accuracy"].get<double>() > 0.3);  // it learnt: 4 steps, far above chance
}

TEST_CASE(
    "a rank killed mid-training makes the other rank fail naming it, and the job exits non-zero") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.max_steps = 200;
  j.timeout_s = 20;
  std::string cfg = write_job(t, j);

  SUBCASE("ranks started by hand: the survivor reports the dead peer") {
    // Both ranks run under the test's own control, so nothing stops the
    // survivor but its own failure detection. The limit (timeout + margin)
    // is a hang guard.
    int port = distopt::test::random_port();
    auto rank_env = [&](int r) {
      return std::vector<std::string>{"DISTOPT_RANK=" + std::to_string(r),
                                      "DISTOPT_WORLD_SIZE=2",
                                      "DISTOPT_LOCAL_RANK=" + std::to_string(r),
                                      "DISTOPT_LOCAL_WORLD_SIZE=2",
                                      "DISTOPT_RENDEZVOUS=tcp://127.0.0.1:" + std::to_string(port),
                                      "DISTOPT_JOB_TOKEN=0123456789abcdef0123456789abcdef",
                                      "DISTOPT_FAULT_INJECT=exit:1:5"};
    };
    auto f0 = std::async(std::launch::async, [&] {
      return run_command({cli(), "train", cfg}, rank_env(0), std::chrono::seconds(90));
    });
    auto f1 = std::async(std::launch::async, [&] {
      return run_command({cli(), "train", cfg}, rank_env(1), std::chrono::seconds(90));
    });
    ProcResult r0 = f0.get(), r1 = f1.get();
    INFO("rank 0:\n" << r0.output << "\nrank 1:\n" << r1.output);
    CHECK(r1.exit_code == 137);
    CHECK(r1.output.find("DISTOPT_FAULT_INJECT") != std::string::npos);
    REQUIRE_FALSE(r0.timed_out);
    CHECK(r0.exit_code != 0);
    CHECK(r0.output.find("error") != std::string::npos);
    CHECK(r0.output.find("rank 1") != std::string::npos);
  }
  SUBCASE("self-launched job: the launcher names the dead rank and exits non-zero") {
    ProcResult r = run_command({cli(), "train", cfg}, {"DISTOPT_FAULT_INJECT=exit:1:5"},
                               std::chrono::seconds(90));
    INFO(r.output);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("rank 1 failed (exit code 137)") != std::string::npos);
    // Rank 0 is given a moment to notice before it is stopped, and says who died.
    CHECK(std::regex_search(r.output, std::regex(R"(\[rank 0\] .*error.*rank 1)")));
    CHECK(r.output.find("summary") == std::string::npos);
  }
}

TEST_CASE("a bad dataset directory gives a clear error naming the file") {
  TempDir t;
  Job j;
  j.world = 1;
  std::string cfg = write_job(t, j);
  SUBCASE("missing files") {
    std::string dir = t.file("nodata");
    distopt::test::make_dirs(dir);
    ProcResult r = run_command({cli(), "train", cfg, "--data", dir});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(dir + "/train-images-idx3-ubyte.gz") != std::string::npos);
    CHECK(r.output.find("missing") != std::string::npos);
  }
  SUBCASE("a malformed file, with 2 ranks") {
    DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
    std::string dir = t.file("broken");
    distopt::test::make_dirs(dir);
    for (const std::string& name : distopt::test::list_dir(kData))
      distopt::test::copy_file(std::string(kData) + "/" + name, dir + "/" + name);
    std::string bad = dir + "/t10k-labels-idx1-ubyte.gz";
    std::remove(bad.c_str());
    std::ofstream(bad) << "not an idx file";
    Job j2;
    std::string cfg2 = write_job(t, j2, "two.yaml");
    ProcResult r =
        run_command({cli(), "train", cfg2, "--data", dir}, {}, std::chrono::seconds(120));
    INFO(r.output);
    REQUIRE_FALSE(r.timed_out);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("malformed IDX label file " + bad) != std::string::npos);
    CHECK(r.output.find("failed (exit code 1)") != std::string::npos);
  }
}

TEST_CASE("distopt train rejects bad usage and bad files") {
  TempDir t;
  ProcResult none = run_command({cli(), "train"});
  CHECK(none.exit_code == 2);
  ProcResult missing = run_command({cli(), "train", t.file("nope.yaml")});
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.find(t.file("nope.yaml")) != std::string::npos);
  std::string bad = t.file("bad.yaml");
  std::ofstream(bad) << "world: {size: 1}\ntrain: {modle: mlp}\n";
  ProcResult typo = run_command({cli(), "train", bad});
  INFO(typo.output);
  CHECK(typo.exit_code == 1);
  CHECK(typo.output.find("modle") != std::string::npos);
  Job j;
  j.world = 1;
  std::string job = write_job(t, j);
  ProcResult steps = run_command({cli(), "train", job, "--max-steps", "-3"});
  CHECK(steps.exit_code == 2);
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();  // the rest needs the data
  ProcResult metrics = run_command({cli(), "train", job, "--metrics", "/nonexistent-dir/m.jsonl"});
  INFO(metrics.output);
  CHECK(metrics.exit_code == 1);
  CHECK(metrics.output.find("cannot open metrics file /nonexistent-dir/m.jsonl") !=
        std::string::npos);
}

TEST_CASE("--plugin-path adds a plugin directory the job file does not name") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.world = 1;
  j.max_steps = 3;
  std::string cfg = write_job(t, j, "job.yaml", /*with_plugins=*/false);
  ProcResult r = run_command(
      {cli(), "train", cfg, "--plugin-path", env_path("DISTOPT_PLUGIN_DIR"), "--epochs", "1"},
      {"DISTOPT_PLUGIN_PATH="}, std::chrono::seconds(120));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("summary: 1 rank(s), 3 steps") != std::string::npos);
}

TEST_CASE("Ctrl-C (SIGINT) to distopt train stops every rank and exits 130") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.max_steps = 0;  // a whole epoch: far longer than the test needs
  j.epochs = 5;
  std::string cfg = write_job(t, j);
  Background b({cli(), "train", cfg});
  // Wait until both ranks train (rank 0 prints progress lines).
  REQUIRE(b.read_until(
      [](const std::string& o) {
        return o.find("[rank 0] epoch 1/5 step 10/") != std::string::npos;
      },
      std::chrono::seconds(120)));
  auto ranks = children_of(b.pid);
  CHECK(ranks.size() == 2);
  REQUIRE(kill(b.pid, SIGINT) == 0);
  int rc = b.wait(std::chrono::seconds(60));
  INFO(b.output);
  CHECK(rc == 130);
  CHECK(b.output.find("interrupted") != std::string::npos);
  CHECK(b.output.find("summary") == std::string::npos);
  for (pid_t p : ranks) CHECK_MESSAGE(!process_exists(p), "rank process " << p << " survived");
}

TEST_CASE("the cnn model trains with Adam on 2 ranks as one process with the batch of both") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.model = "cnn";
  j.optimizer = "{name: adam, lr: 1.0e-3}";
  j.max_steps = 15;
  TrainRun r = train_ok(t, j, "job");
  CHECK(r.proc.output.find("model cnn (215370 parameters)") != std::string::npos);
  TrainRun r1 = train_ok(t, one_process_of(j), "one");
  auto &m = r.metrics, &b = r1.metrics;
  REQUIRE(m.size() == 2);
  REQUIRE(b.size() == 2);
  CHECK(m[1]["model"] == "cnn");
  CHECK(m[1]["optimizer"] == "adam");
  // The same samples averaged the same way: the 2 ranks end where the one
  // process does up to float rounding (measured: equal to 6 digits).
  MESSAGE("cnn test loss: 2 ranks " << m[0]["test_loss"].get<double>() << ", 1 process "
                                    << b[0]["test_loss"].get<double>() << "; accuracy "
                                    << m[0]["test_accuracy"].get<double>() << ", "
                                    << b[0]["test_accuracy"].get<double>());
  check_same_epoch(m[0], b[0]);
  CHECK(m[0]["test_accuracy"].get<double>() > 0.5);  // it learnt (measured 0.61; chance 0.1)
  // Adam keeps two moments per parameter.
  CHECK(m[1]["state_bytes_per_rank"][0].get<double>() >= 2 * 215370.0 * 4);
}

namespace {
// The best kernel set the CPU supports, read from /proc/cpuinfo independently
// of core/src/machine/blas.cpp ("" = neither AVX-512 nor AVX2+FMA).
std::string best_coretype_from_cpuinfo() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream is(line.substr(line.find(':') + 1));
    std::set<std::string> flags{std::istream_iterator<std::string>(is),
                                std::istream_iterator<std::string>()};
    if (flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512vl") &&
        flags.count("avx512dq"))
      return "SkylakeX";
    if (flags.count("avx2") && flags.count("fma")) return "Haswell";
    return "";
  }
  return "";
}

// The generic sets OpenBLAS falls back to for CPU models it does not know.
bool generic_fallback(const std::string& core) {
  for (const char* g : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Katmai", "Coppermine",
                        "Northwood", "Banias", "Atom", "Penryn", "Dunnington"})
    if (core == g) return true;
  return false;
}

std::string blas_kernels(const std::string& output) {
  std::smatch m;
  if (std::regex_search(output, m, std::regex(R"(BLAS: OpenBLAS, (\w+) kernels)"))) return m[1];
  return "";
}
}  // namespace

// distopt's rule, not one machine's answer: whatever kernel set OpenBLAS
// picks by itself here (Prescott on a CPU it does not recognise, Cooperlake,
// SkylakeX, Zen, ...), distopt replaces it only if it is a generic fallback
// (or Haswell on an AVX-512 CPU), and never overrides OPENBLAS_CORETYPE.
TEST_CASE("distopt replaces only a generic OpenBLAS kernel set, and respects OPENBLAS_CORETYPE") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.world = 1;
  j.max_steps = 2;
  std::string cfg = write_job(t, j);
  // `env` clears what this test's own environment may hold, then sets `vars`.
  auto train = [&](const std::vector<std::string>& vars) {
    std::vector<std::string> argv = {"env",
                                     "-u",
                                     "OPENBLAS_CORETYPE",
                                     "-u",
                                     "DISTOPT_BLAS_REEXEC",
                                     "-u",
                                     "DISTOPT_BLAS_AUTOTUNE"};
    argv.insert(argv.end(), vars.begin(), vars.end());
    argv.insert(argv.end(), {cli(), "train", cfg});
    ProcResult r = run_command(argv, {}, std::chrono::seconds(120));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r.output;
  };
  // OpenBLAS's own choice on this CPU: distopt's fix turned off.
  const std::string own = blas_kernels(train({"DISTOPT_BLAS_AUTOTUNE=0"}));
  if (own.empty()) {
    MESSAGE("libblas.so.3 is not OpenBLAS here; nothing to check");
    return;
  }
  const std::string out = train({});
  const std::string used = blas_kernels(out), best = best_coretype_from_cpuinfo();
  MESSAGE("OpenBLAS chooses " << own << "; distopt runs " << used
                              << "; best for the CPU: " << (best.empty() ? "none" : best));
  const bool replace = !best.empty() && own != best &&
                       (generic_fallback(own) || (own == "Haswell" && best == "SkylakeX"));
  if (replace) {
    CHECK(used == best);
    CHECK(out.find("(OpenBLAS chose " + own + "; OPENBLAS_CORETYPE set by distopt)") !=
          std::string::npos);
  } else {
    CHECK(used == own);
    CHECK(out.find("OpenBLAS chose") == std::string::npos);
  }
  // An explicit choice of the user is kept as it is, even a generic one.
  for (const std::string& explicit_core : {std::string("Sandybridge"), std::string("Prescott")}) {
    const std::string o = train({"OPENBLAS_CORETYPE=" + explicit_core});
    CHECK(blas_kernels(o) == explicit_core);
  }
}
