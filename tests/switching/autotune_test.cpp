// `autotune:` on 2 real ranks: the tuner tries the configured bucket_cap_mb
// and the ladder's next values, keeps the fastest by the table every rank
// shares, changes no result (bucket layout does not change what an exact
// mean computes), and a checkpoint keeps the choice so a resume does not
// tune again. Which setting is fastest is machine-dependent and not
// asserted here (tools/bench/autotune.py measures it).
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "rank_steps.hpp"
#include "result_files.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kWorld = 2, kIn = 20, kClasses = 10;

std::string job_yaml(const std::string& extra) {
  std::ostringstream y;
  y << plugins_and_world_yaml(kWorld, random_port()) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean, options: {bucket_cap_mb: 0.0001}}\n"  // a bucket per parameter
    << "algorithm: {name: allreduce}\n"
    << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
    << extra;
  return y.str();
}

// Rank r trains `steps` steps (optionally resuming from / saving to `ckpt`)
// and writes: its parameters, then the chosen cap, the bucket count, and
// the table (cap, seconds) pairs.
void run(const std::string& job, const std::string& dir, const std::string& tag, int first,
         int steps, const std::string& load, const std::string& save) {
  auto codes = fork_ranks(kWorld, [&](int rank) {
    torch::set_num_threads(1);
    torch::manual_seed(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, kWorld, "tune.yaml");
    auto opt = rt.make_optimizer(*net);
    if (!load.empty()) rt.load_checkpoint(load, *net, opt);
    for (int t = first; t < first + steps; ++t) random_batch_step(net, opt, rank, t);
    if (!save.empty()) rt.save_checkpoint(save, *net, opt);
    auto v = flat_params(net);
    v.push_back(opt.autotuned_bucket_cap_mb());
    v.push_back(static_cast<double>(opt.num_buckets()));
    for (const auto& [cap, s] : opt.autotune_table()) {
      v.push_back(cap);
      v.push_back(s);
    }
    write_doubles(rank_file(dir, tag, rank), v);
    return 0;
  });
  for (int c : codes) REQUIRE(c == 0);
}

struct Result {
  std::vector<double> params, table;
  double chosen = 0, buckets = 0;
};

Result read(const std::string& dir, const std::string& tag, int rank, size_t nparams) {
  const auto v = read_doubles(rank_file(dir, tag, rank));
  Result r;
  r.params.assign(v.begin(), v.begin() + static_cast<long>(nparams));
  r.chosen = v[nparams];
  r.buckets = v[nparams + 1];
  r.table.assign(v.begin() + static_cast<long>(nparams) + 2, v.end());
  return r;
}

}  // namespace

TEST_CASE("autotune: tries the settings, keeps the fastest, changes no result, resumes tuned") {
  const std::string dir = make_temp_dir("distopt_autotune");
  const size_t nparams = [] {
    torch::manual_seed(7);
    Mlp3 net(kIn, kClasses);
    return flat_params(net).size();
  }();
  run(job_yaml(""), dir, "plain", 0, 16, "", "");
  run(job_yaml("autotune: {steps: 4, trials: 3}\n"), dir, "tuned", 0, 16, "", dir + "/ckpt");
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const Result plain = read(dir, "plain", r, nparams);
    const Result tuned = read(dir, "tuned", r, nparams);
    CHECK(plain.chosen == -1);
    CHECK(plain.buckets == 6);  // Mlp3: 6 parameters, a bucket each
    // Tried in order: the configured cap, then 25 and 4 MiB.
    REQUIRE(tuned.table.size() == 6);
    CHECK(tuned.table[0] == doctest::Approx(0.0001));
    CHECK(tuned.table[2] == 25);
    CHECK(tuned.table[4] == 4);
    // The winner is the fastest entry of the shared table, on every rank.
    size_t best = 0;
    for (size_t i = 1; i < 3; ++i)
      if (tuned.table[2 * i + 1] < tuned.table[2 * best + 1]) best = i;
    CHECK(tuned.chosen == tuned.table[2 * best]);
    CHECK(tuned.buckets == (best == 0 ? 6 : 1));
    const Result other = read(dir, "tuned", 1 - r, nparams);
    CHECK(other.table == tuned.table);
    // An exact mean over 2 ranks does not depend on the bucket layout.
    CHECK(max_abs_diff(tuned.params, plain.params) == 0);
  }
  // The resume applies the choice without tuning again, and continues.
  run(job_yaml("autotune: {steps: 4, trials: 3}\n"), dir, "resumed", 16, 4, dir + "/ckpt", "");
  run(job_yaml(""), dir, "plain20", 0, 20, "", "");
  const Result tuned = read(dir, "tuned", 0, nparams);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const Result resumed = read(dir, "resumed", r, nparams);
    CHECK(resumed.chosen == tuned.chosen);
    CHECK(resumed.table.empty());
    CHECK(resumed.buckets == tuned.buckets);
    CHECK(max_abs_diff(resumed.params, read(dir, "plain20", r, nparams).params) == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("autotune: bad sections are refused naming the file and line") {
  auto error_of = [](const std::string& yaml) -> std::string {
    try {
      distopt::parse_job_config(yaml, "tune.yaml");
    } catch (const distopt::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of("autotune: {trials: 9}\n").find("tune.yaml:1:") != std::string::npos);
  CHECK(error_of("autotune: {trials: 9}\n").find("autotune.trials") != std::string::npos);
  CHECK(error_of("autotune: {step: 9}\n").find("unknown key 'step'") != std::string::npos);
  CHECK(error_of("schedule:\n  - {until_step: 5}\n  - {}\nautotune: {}\n")
            .find("not supported together with schedule") != std::string::npos);
  CHECK(distopt::parse_job_config("autotune:\n", "t.yaml").autotune.enabled);
  CHECK_FALSE(distopt::parse_job_config("autotune: {enabled: false}\n", "t.yaml").autotune.enabled);
}
