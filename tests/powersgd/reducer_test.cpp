// The `powersgd` reducer on 2 real processes over loopback (tcp communicator),
// driven directly through its C vtable with hand-made buckets, against the
// behaviour the PowerSGD paper (Vogels et al. 2019) and PyTorch's
// powerSGD_hook define.
//
// Forked children do the distopt/torch work and write every step's reduced
// bucket and bytes_sent to a file; the parent (which never touches torch, so
// it can keep forking) recomputes the true averages from the same
// deterministic gradients and asserts.
#include "distopt/reducer.h"

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/host_api.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::test::fork_ranks;
using distopt::test::random_port;

constexpr int kWorld = 2;
constexpr size_t kGap = 3;        // padding between entries (must stay untouched)
constexpr float kPadding = 7.0f;  // value of the padding on every rank

struct Spec {
  std::vector<std::vector<int64_t>> shapes;
  std::string options = "{}";  // powersgd options (YAML)
  int steps = 3;
  float base = 0;          // weight of a gradient part fixed over steps and ranks
  int delay_rank1_ms = 0;  // rank 1 reduces this late (asynchrony check)
};

struct Layout {
  std::vector<size_t> offset, numel;
  size_t total = 0;
};
Layout layout_of(const Spec& s) {
  Layout l;
  for (const auto& sh : s.shapes) {
    size_t n = 1;
    for (int64_t d : sh) n *= static_cast<size_t>(d);
    l.offset.push_back(l.total);
    l.numel.push_back(n);
    l.total += n + kGap;
  }
  return l;
}

// Deterministic uniform [-1, 1) from a key (splitmix64).
float uniform(uint64_t key) {
  uint64_t z = key + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

// Gradient element `i` (flat index) of `rank` at `step`.
float grad(const Spec& s, int rank, int step, size_t i) {
  float noise =
      uniform((static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(step) << 32) ^ i);
  return s.base * uniform(0xABCDEF0000000000ull ^ i) + noise;
}

std::vector<float> bucket_of(const Spec& s, const Layout& l, int rank, int step) {
  std::vector<float> b(l.total, kPadding);
  for (size_t k = 0; k < l.offset.size(); ++k)
    for (size_t j = 0; j < l.numel[k]; ++j)
      b[l.offset[k] + j] = grad(s, rank, step, l.offset[k] + j);
  return b;
}

// The true average in the communicator's arithmetic: (a + b) / 2 in float.
std::vector<float> mean_of(const Spec& s, const Layout& l, int step) {
  auto a = bucket_of(s, l, 0, step), b = bucket_of(s, l, 1, step);
  for (size_t i = 0; i < a.size(); ++i) a[i] = (a[i] + b[i]) / 2.0f;
  return a;
}

struct StepOut {
  double bytes_sent = 0;  // cumulative
  double reduce_ms = 0;   // how long reduce() took
  bool done_at_once = false;
  std::vector<float> flat;
};

std::string tmpdir() { return distopt::test::make_temp_dir("distopt_powersgd"); }

int child(const Spec& s, int rank, int port, const std::string& out_path) {
  using namespace distopt;
  std::ostringstream y;
  y << test::plugins_and_world_yaml(kWorld, port) << "communicator: {name: tcp}\n"
    << "reducer: {name: powersgd, options: " << s.options << "}\n";
  Runtime rt = test::rank_runtime(y.str(), rank, kWorld, "powersgd_test.yaml");
  const ComponentInfo& info = rt.registry().get(DOPT_KIND_REDUCER, "powersgd");
  Options opts = Options::validate(YAML::Load(s.options), info.options, "powersgd_test.yaml",
                                   "reducer.options");

  const Layout l = layout_of(s);
  std::vector<float> flat(l.total);
  int64_t flat_shape = 0;
  DLTensor dl = make_dltensor(flat.data(), static_cast<int64_t>(l.total),
                              DLDataType{kDLFloat, 32, 1}, &flat_shape);
  std::vector<dopt_bucket_entry> entries(s.shapes.size());
  std::vector<std::string> names;
  for (size_t k = 0; k < s.shapes.size(); ++k) names.push_back("p" + std::to_string(k));
  for (size_t k = 0; k < s.shapes.size(); ++k) {
    dopt_bucket_entry& e = entries[k];
    e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
    e.name = names[k].c_str();
    e.param_index = static_cast<int32_t>(k);
    e.offset = l.offset[k];
    e.numel = l.numel[k];
    e.ndim = static_cast<int32_t>(s.shapes[k].size());
    e.shape = s.shapes[k].data();
  }
  dopt_bucket bucket{};
  bucket.struct_size = DOPT_BUCKET_STRUCT_SIZE;
  bucket.index = 0;
  bucket.flat = &dl;
  bucket.entries = entries.data();
  bucket.num_entries = entries.size();

  dopt_create_args args{};
  args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  args.rank = rank;
  args.world_size = kWorld;
  args.local_rank = rank;
  args.local_world_size = kWorld;
  args.options = opts.c_handle();
  args.scope = "test/powersgd";
  const auto* vt = static_cast<const dopt_reducer_v1*>(info.vtable);
  dopt_reducer* red = nullptr;
  check_status(vt->create(&args, rt.communicator().ref(), &bucket, 1, &red), "powersgd", "create");

  std::ofstream out(out_path, std::ios::binary);
  for (int step = 1; step <= s.steps; ++step) {
    auto g = bucket_of(s, l, rank, step);
    std::copy(g.begin(), g.end(), flat.begin());
    if (rank == 1 && s.delay_rank1_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(s.delay_rank1_ms));
    dopt_reduce_request* req = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    check_status(vt->reduce(red, &bucket, &req), "powersgd", "reduce");
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    int32_t done = 0;
    check_status(vt->test(req, &done), "powersgd", "test");
    check_status(vt->wait(req, 60000), "powersgd", "wait");
    vt->request_free(req);
    double hdr[3] = {static_cast<double>(vt->bytes_sent(red)), ms, static_cast<double>(done)};
    out.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
    out.write(reinterpret_cast<const char*>(flat.data()),
              static_cast<std::streamsize>(flat.size() * sizeof(float)));
  }
  out.close();
  check_status(vt->destroy(red), "powersgd", "destroy");
  rt.barrier();
  return 0;
}

// Run the spec on 2 ranks; result[rank][step-1].
std::vector<std::vector<StepOut>> run(const Spec& s) {
  const std::string dir = tmpdir();
  const int port = random_port();
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        // One intra-op thread each: 2 ranks share this machine's cores.
        setenv("OMP_NUM_THREADS", "1", 1);
        return child(s, rank, port, dir + "/rank" + std::to_string(rank) + ".bin");
      },
      std::chrono::seconds(120));
  const Layout l = layout_of(s);
  std::vector<std::vector<StepOut>> res(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".bin", std::ios::binary);
    for (int step = 0; step < s.steps; ++step) {
      StepOut o;
      double hdr[3];
      REQUIRE(in.read(reinterpret_cast<char*>(hdr), sizeof hdr));
      o.bytes_sent = hdr[0];
      o.reduce_ms = hdr[1];
      o.done_at_once = hdr[2] != 0;
      o.flat.resize(l.total);
      REQUIRE(in.read(reinterpret_cast<char*>(o.flat.data()),
                      static_cast<std::streamsize>(l.total * sizeof(float))));
      res[r].push_back(std::move(o));
    }
    std::remove((dir + "/rank" + std::to_string(r) + ".bin").c_str());
  }
  std::remove(dir.c_str());
  return res;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}
double norm(const std::vector<double>& a) {
  double s = 0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

void check_same_on_every_rank(const std::vector<std::vector<StepOut>>& res) {
  for (size_t t = 0; t < res[0].size(); ++t) {
    CAPTURE(t);
    CHECK(std::memcmp(res[0][t].flat.data(), res[1][t].flat.data(),
                      res[0][t].flat.size() * sizeof(float)) == 0);
    CHECK(res[0][t].bytes_sent == res[1][t].bytes_sent);
  }
}

void check_padding_untouched(const Spec& s, const std::vector<std::vector<StepOut>>& res) {
  const Layout l = layout_of(s);
  for (const auto& rank_res : res)
    for (const auto& o : rank_res)
      for (size_t k = 0; k < l.offset.size(); ++k)
        for (size_t j = 0; j < kGap; ++j) CHECK(o.flat[l.offset[k] + l.numel[k] + j] == kPadding);
}

}  // namespace

TEST_CASE(
    "powersgd with rank >= min(n, m) reproduces the mean; bytes are the P, Q and 1-D traffic") {
  Spec s;
  // n < m, n > m, a 3-D weight folded to 4 x 6, a bias.
  s.shapes = {{6, 10}, {12, 5}, {4, 3, 2}, {7}};
  s.options = "{rank: 8, min_compression_rate: 0, start_iter: 0}";
  s.steps = 4;
  auto res = run(s);
  const Layout l = layout_of(s);
  for (int t = 1; t <= s.steps; ++t) {
    CAPTURE(t);
    auto mean = mean_of(s, l, t);
    for (int r = 0; r < kWorld; ++r) CHECK(max_abs_diff(res[r][t - 1].flat, mean) <= 1e-5);
  }
  check_same_on_every_rank(res);
  check_padding_untouched(s, res);
  // Per step, 2 ranks: a ring allreduce sends 2 (W-1)/W x bytes = the bytes.
  // P's: 6x6 + 12x5 + 4x4 (r clamped to min(n, m)) and the bias (7) in one
  // buffer; Q's: 10x6 + 5x5 + 6x4.
  const double per_step = ((36 + 60 + 16 + 7) + (60 + 25 + 24)) * 4.0;
  for (int t = 1; t <= s.steps; ++t)
    CHECK(res[0][t - 1].bytes_sent == doctest::Approx(per_step * t));
}

TEST_CASE("powersgd start_iter steps are the exact mean, then compression starts") {
  Spec s;
  s.shapes = {{32, 24}, {16}};
  s.options = "{rank: 2, start_iter: 3}";
  s.steps = 5;
  s.base = 1.0f;
  auto res = run(s);
  const Layout l = layout_of(s);
  for (int t = 1; t <= 3; ++t) {
    CAPTURE(t);
    auto mean = mean_of(s, l, t);
    for (int r = 0; r < kWorld; ++r) CHECK(res[r][t - 1].flat == mean);  // bit for bit
    CHECK(res[0][t - 1].bytes_sent ==
          doctest::Approx(l.total * 4.0 * t));  // whole flat buffer per step
  }
  for (int t = 4; t <= 5; ++t) {
    CAPTURE(t);
    CHECK(max_abs_diff(res[0][t - 1].flat, mean_of(s, l, t)) >
          1e-2);  // rank 2 of a 32 x 24 matrix: lossy
  }
  // From step 4: P (32x2) + bias (16), then Q (24x2).
  CHECK(res[0][3].bytes_sent - res[0][2].bytes_sent == doctest::Approx((64 + 16 + 48) * 4.0));
  check_same_on_every_rank(res);
  check_padding_untouched(s, res);
}

TEST_CASE(
    "powersgd error feedback: the sum of compressed updates tracks the sum of true averages") {
  Spec s;
  s.shapes = {{32, 24}, {16}};
  s.options = "{rank: 2, start_iter: 0}";
  s.steps = 200;
  s.base = 1.0f;  // a full-rank part common to all steps and ranks, plus noise
  auto res = run(s);
  check_same_on_every_rank(res);
  const Layout l = layout_of(s);
  const size_t n = l.numel[0];
  std::vector<double> sum_true(n, 0), sum_comp(n, 0);
  std::vector<double> gap(s.steps + 1, 0);  // ||sum of true - sum of compressed|| after step t
  double per_step_errors = 0;               // sum over t of ||compressed_t - true_t||
  for (int t = 1; t <= s.steps; ++t) {
    auto mean = mean_of(s, l, t);
    const auto& out = res[0][t - 1].flat;
    std::vector<double> d(n), diff(n);
    for (size_t i = 0; i < n; ++i) {
      sum_true[i] += mean[i];
      sum_comp[i] += out[i];
      d[i] = sum_true[i] - sum_comp[i];
      diff[i] = static_cast<double>(out[i]) - mean[i];
    }
    gap[t] = norm(d);
    per_step_errors += norm(diff);
    // The bias goes uncompressed: exact.
    for (size_t j = 0; j < l.numel[1]; ++j) CHECK(out[l.offset[1] + j] == mean[l.offset[1] + j]);
  }
  std::vector<double> mean1(n);
  auto m1 = mean_of(s, l, 1);
  for (size_t i = 0; i < n; ++i) mean1[i] = m1[i];
  // Each step alone is a poor (rank 2 of 24) approximation ...
  CHECK(gap[1] > 0.3 * norm(mean1));
  // ... but the residual (= the gap, by telescoping) stays bounded instead of
  // adding up: the second half never exceeds the first half's peak by much,
  double peak_first = 0, peak_second = 0;
  for (int t = 1; t <= s.steps / 2; ++t) peak_first = std::max(peak_first, gap[t]);
  for (int t = s.steps / 2 + 1; t <= s.steps; ++t) peak_second = std::max(peak_second, gap[t]);
  INFO("gap after step 1: " << gap[1] << ", peak in the first half: " << peak_first
                            << ", in the second: " << peak_second << ", final: " << gap[s.steps]
                            << ", |sum of true|: " << norm(sum_true)
                            << ", sum of per-step errors: " << per_step_errors);
  CHECK(peak_second <= 1.5 * peak_first);
  // so the compressed sum follows the true sum ever more closely,
  CHECK(gap[s.steps] < 0.1 * norm(sum_true));
  // far better than the per-step errors would allow if they accumulated.
  CHECK(gap[s.steps] < 0.1 * per_step_errors);
}

TEST_CASE("powersgd warm start (reuse_query) changes the result after the first step") {
  Spec s;
  s.shapes = {{32, 24}, {16}};
  s.steps = 3;
  s.base = 1.0f;
  s.options = "{rank: 2, start_iter: 0, seed: 5}";
  auto warm = run(s);
  s.options = "{rank: 2, start_iter: 0, seed: 5, warm_start: false}";
  auto cold = run(s);
  s.options = "{rank: 2, start_iter: 0, seed: 5, reuse_query: false}";
  auto cold_alias = run(s);
  check_same_on_every_rank(warm);
  check_same_on_every_rank(cold);
  // Step 1: the same seeded Q either way.
  CHECK(warm[0][0].flat == cold[0][0].flat);
  // Later steps: last step's Q vs a fresh random one.
  CHECK(max_abs_diff(warm[0][1].flat, cold[0][1].flat) > 1e-3);
  CHECK(max_abs_diff(warm[0][2].flat, cold[0][2].flat) > 1e-3);
  // reuse_query: false is warm_start: false.
  for (int t = 0; t < s.steps; ++t) CHECK(cold_alias[0][t].flat == cold[0][t].flat);
}

TEST_CASE("powersgd reduce() returns at once; the request completes when the peer arrives") {
  Spec s;
  s.shapes = {{32, 24}, {16}};
  s.options = "{rank: 2, start_iter: 1}";  // one plain step, one compressed step
  s.steps = 2;
  s.delay_rank1_ms = 1000;
  auto res = run(s);
  for (int t = 0; t < s.steps; ++t) {
    CAPTURE(t);
    // Rank 0 enqueued while rank 1 was still asleep: reduce() did not wait
    // for the allreduces (it returned in well under the peer's delay, on a
    // machine however loaded), and the request was not complete right after.
    CHECK(res[0][t].reduce_ms < s.delay_rank1_ms / 2);
    CHECK_FALSE(res[0][t].done_at_once);
  }
  check_same_on_every_rank(res);
}
