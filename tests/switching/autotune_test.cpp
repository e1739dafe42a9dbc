// `autotune:` on 2 real ranks: the tuner tries the configured bucket_cap_mb
// and the ladder's next values, then the best with overlap flipped, then
// with the reducer flipped between `mean` and `hierarchical`; it keeps the
// fastest by the table every rank shares, changes no result (bucket layout,
// overlap and the reduction's hierarchy do not change what an exact mean of
// 2 values computes), and a checkpoint keeps the choice so a resume does not
// tune again. Which setting is fastest is machine-dependent and not
// asserted here (tools/bench/autotune.py measures it).
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
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kWorld = 2, kIn = 20, kClasses = 10;

std::string job_yaml(const std::string& extra, const std::string& reducer = "mean") {
  std::ostringstream y;
  y << plugins_and_world_yaml(kWorld, random_port()) << "communicator: {name: tcp}\n"
    << "reducer: {name: " << reducer
    << ", options: {bucket_cap_mb: 0.0001}}\n"  // a bucket per parameter
    << "algorithm: {name: allreduce}\n"
    << "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n"
    << extra;
  return y.str();
}

// Rank r trains `steps` steps (optionally resuming from / saving to `ckpt`)
// and writes: its parameters, then the chosen setting (cap, overlap,
// hierarchical; cap -1 when none), the bucket count, and the table rows
// (cap, overlap, hierarchical, seconds).
void run(const std::string& job, const std::string& dir, const std::string& tag, int first,
         int steps, const std::string& load, const std::string& save) {
  auto codes = fork_ranks(kWorld, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, kWorld, "tune.yaml");
    auto opt = rt.make_optimizer(*net);
    if (!load.empty()) rt.load_checkpoint(load, *net, opt);
    for (int t = first; t < first + steps; ++t) random_batch_step(net, opt, rank, t);
    if (!save.empty()) rt.save_checkpoint(save, *net, opt);
    auto v = flat_params(net);
    const auto chosen = opt.autotuned_setting();
    v.push_back(chosen ? chosen->bucket_cap_mb : -1);
    v.push_back(chosen && chosen->overlap);
    v.push_back(chosen && chosen->hierarchical);
    v.push_back(static_cast<double>(opt.num_buckets()));
    for (const auto& row : opt.autotune_rows())
      v.insert(v.end(), {row.setting.bucket_cap_mb, double(row.setting.overlap),
                         double(row.setting.hierarchical), row.seconds});
    write_doubles(rank_file(dir, tag, rank), v);
    return 0;
  });
  for (int c : codes) REQUIRE(c == 0);
}

struct Row {
  double cap = 0;
  bool overlap = false, hierarchical = false;
  double seconds = 0;
  bool operator==(const Row& o) const {
    return cap == o.cap && overlap == o.overlap && hierarchical == o.hierarchical &&
           seconds == o.seconds;
  }
};

struct Result {
  std::vector<double> params;
  std::vector<Row> rows;
  Row chosen;  // seconds unused
  double buckets = 0;
};

Result read(const std::string& dir, const std::string& tag, int rank, size_t nparams) {
  const auto v = read_doubles(rank_file(dir, tag, rank));
  Result r;
  r.params.assign(v.begin(), v.begin() + static_cast<long>(nparams));
  r.chosen = {v[nparams], v[nparams + 1] != 0, v[nparams + 2] != 0, 0};
  r.buckets = v[nparams + 3];
  for (size_t i = nparams + 4; i + 3 < v.size(); i += 4)
    r.rows.push_back({v[i], v[i + 1] != 0, v[i + 2] != 0, v[i + 3]});
  return r;
}

size_t fastest(const std::vector<Row>& rows, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (rows[i].seconds < rows[best].seconds) best = i;
  return best;
}

size_t count_params() {
  distopt::test::seed_cpu(7);
  Mlp3 net(kIn, kClasses);
  return flat_params(net).size();
}

}  // namespace

TEST_CASE("autotune: tries the settings, keeps the fastest, changes no result, resumes tuned") {
  const std::string dir = make_temp_dir("distopt_autotune");
  const size_t nparams = count_params();
  run(job_yaml(""), dir, "plain", 0, 24, "", "");
  run(job_yaml("autotune: {steps: 4, trials: 3}\n"), dir, "tuned", 0, 24, "", dir + "/ckpt");
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const Result plain = read(dir, "plain", r, nparams);
    const Result tuned = read(dir, "tuned", r, nparams);
    CHECK(plain.chosen.cap == -1);
    CHECK(plain.rows.empty());
    CHECK(plain.buckets == 6);  // Mlp3: 6 parameters, a bucket each
    // Stage 1, in order: the configured cap, then 25 and 4 MiB (overlap on,
    // flat mean as configured).
    REQUIRE(tuned.rows.size() == 5);
    CHECK(tuned.rows[0].cap == doctest::Approx(0.0001));
    CHECK(tuned.rows[1].cap == 25);
    CHECK(tuned.rows[2].cap == 4);
    for (size_t i = 0; i < 3; ++i) CHECK((tuned.rows[i].overlap && !tuned.rows[i].hierarchical));
    // Stage 2: the fastest cap with overlap off.
    const Row caps_best = tuned.rows[fastest(tuned.rows, 3)];
    CHECK(tuned.rows[3].cap == caps_best.cap);
    CHECK(!tuned.rows[3].overlap);
    CHECK(!tuned.rows[3].hierarchical);
    // Stage 3: the fastest so far with the hierarchical reducer.
    const Row so_far = tuned.rows[fastest(tuned.rows, 4)];
    CHECK(tuned.rows[4].cap == so_far.cap);
    CHECK(tuned.rows[4].overlap == so_far.overlap);
    CHECK(tuned.rows[4].hierarchical);
    // The winner is the fastest row of the shared table, on every rank.
    const Row best = tuned.rows[fastest(tuned.rows, 5)];
    CHECK(tuned.chosen.cap == best.cap);
    CHECK(tuned.chosen.overlap == best.overlap);
    CHECK(tuned.chosen.hierarchical == best.hierarchical);
    CHECK(tuned.buckets == (best.cap < 0.001 ? 6 : 1));
    const Result other = read(dir, "tuned", 1 - r, nparams);
    CHECK((other.rows == tuned.rows));
    // An exact mean over 2 ranks does not depend on the bucket layout, on
    // overlap or on the hierarchy (a + b is exact in any order).
    CHECK(max_abs_diff(tuned.params, plain.params) == 0);
  }
  // The resume applies the choice without tuning again, and continues.
  run(job_yaml("autotune: {steps: 4, trials: 3}\n"), dir, "resumed", 24, 4, dir + "/ckpt", "");
  run(job_yaml(""), dir, "plain28", 0, 28, "", "");
  const Result tuned = read(dir, "tuned", 0, nparams);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const Result resumed = read(dir, "resumed", r, nparams);
    CHECK(resumed.chosen.cap == tuned.chosen.cap);
    CHECK(resumed.chosen.overlap == tuned.chosen.overlap);
    CHECK(resumed.chosen.hierarchical == tuned.chosen.hierarchical);
    CHECK(resumed.rows.empty());
    CHECK(resumed.buckets == tuned.buckets);
    CHECK(max_abs_diff(resumed.params, read(dir, "plain28", r, nparams).params) == 0);
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("autotune: the overlap and hierarchical stages can be turned off; hierarchical flips") {
  const std::string dir = make_temp_dir("distopt_autotune_stages");
  const size_t nparams = count_params();
  run(job_yaml("autotune: {steps: 3, trials: 2, overlap: false, hierarchical: false}\n"), dir,
      "caps", 0, 10, "", "");
  // A hierarchical job flips to flat mean in the last stage.
  run(job_yaml("autotune: {steps: 3, trials: 2, overlap: false}\n", "hierarchical"), dir, "hier", 0,
      10, "", "");
  // A reducer other than mean / hierarchical has no hierarchy stage.
  run(job_yaml("autotune: {steps: 3, trials: 2}\n", "powersgd"), dir, "psgd", 0, 10, "", "");
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const Result caps = read(dir, "caps", r, nparams);
    REQUIRE(caps.rows.size() == 2);
    CHECK((caps.rows[0].overlap && caps.rows[1].overlap));
    CHECK((!caps.rows[0].hierarchical && !caps.rows[1].hierarchical));
    const Result hier = read(dir, "hier", r, nparams);
    REQUIRE(hier.rows.size() == 3);
    CHECK((hier.rows[0].hierarchical && hier.rows[1].hierarchical));
    CHECK(!hier.rows[2].hierarchical);
    CHECK(hier.chosen.hierarchical == hier.rows[fastest(hier.rows, 3)].hierarchical);
    const Result psgd = read(dir, "psgd", r, nparams);
    REQUIRE(psgd.rows.size() == 3);
    CHECK(!psgd.rows[2].overlap);
    for (const Row& row : psgd.rows) CHECK(!row.hierarchical);
  }
  distopt::test::remove_tree(dir);
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
  CHECK(error_of("autotune: {overlap: maybe}\n").find("autotune.overlap") != std::string::npos);
  CHECK(error_of("autotune: {step: 9}\n").find("unknown key 'step'") != std::string::npos);
  CHECK(error_of("schedule:\n  - {until_step: 5}\n  - {}\nautotune: {}\n")
            .find("not supported together with schedule") != std::string::npos);
  CHECK(distopt::parse_job_config("autotune:\n", "t.yaml").autotune.enabled);
  CHECK_FALSE(distopt::parse_job_config("autotune: {enabled: false}\n", "t.yaml").autotune.enabled);
}
