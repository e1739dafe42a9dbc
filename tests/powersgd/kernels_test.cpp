// The `powersgd` reducer's device-generic orthogonalisation (libtorch ops,
// what CUDA buckets run; kernels: generic) against its CPU loop (kernels:
// cpu), both on host buckets, on 2 and 3 real processes
// (tests/compress/kernels_harness.hpp). The Gram-Schmidt differs in rounding
// only (classical vs modified projections, library dot products, both in
// float64), so the outputs and the saved state agree to float tolerance (for
// float32 buckets usually bit for bit); a checkpoint of either path loads into the other; every
// rank ends each path with the same bits; the same bytes are sent. Torch-free.
#include <doctest/doctest.h>

#include <cstdlib>

#include "kernels_harness.hpp"

namespace {

namespace k = distopt::test::kernels;

// Matrices (one folded 4-D weight), biases, padding between entries.
const std::vector<k::BucketSpec> kBuckets = {
    {{"fc2.weight", {8, 24}}, {"fc2.bias", {8}}},
    {{"fc1.weight", {24, 20}}, {"fc1.bias", {24}}, {"conv.weight", {6, 2, 3, 3}}}};

k::Case make(const std::string& options, bool f64 = false) {
  k::Case c;
  c.reducer = "powersgd";
  c.options = options;
  c.buckets = kBuckets;
  c.f64 = f64;
  c.save_at = 4;
  c.steps = 8;
  return c;
}

// Values are O(1); the two orthogonalisations differ by float32 rounding
// (1e-7 relative), which the power iteration and error feedback carry over
// a few steps without growth.
constexpr double kTol = 2e-4;

void check(const std::vector<k::Case>& cases, int world) {
  auto res = k::run_all(cases, world);
  REQUIRE(res.size() == static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const k::Case& c = cases[i];
      const k::Summary& s = res[static_cast<size_t>(r)][i];
      CAPTURE(r);
      CAPTURE(c.options);
      CAPTURE(c.f64);
      CAPTURE(s.keys);
      if (r == 0)
        MESSAGE(c.options << (c.f64 ? " float64" : " float32") << ": generic vs cpu max |diff| "
                          << s.ab_diff << " (" << s.ab_bits << " elements differ), state "
                          << s.store_diff << ", cross-loaded " << s.ca_diff << " / " << s.db_diff);
      CHECK(s.ab_diff <= kTol);
      // Really two implementations: float64 buckets show their rounding
      // differences (float32 ones usually round both double results alike).
      if (c.f64) CHECK(s.ab_bits > 0);
      CHECK(s.store_diff <= kTol);
      CHECK(s.same_keys);
      CHECK(s.ca_diff <= kTol);  // CPU checkpoint -> generic path
      CHECK(s.db_diff <= kTol);  // generic checkpoint -> CPU loop
      CHECK(s.bytes_a == s.bytes_b);
      CHECK(s.hash_a == res[0][i].hash_a);
      CHECK(s.hash_b == res[0][i].hash_b);
      CHECK(s.keys.find("error_feedback/fc1.weight;") != std::string::npos);
      if (r == 0) CHECK(s.keys.find("powersgd/rng;") != std::string::npos);  // rank 0 puts it
      CHECK(s.fresh_diff > 1e-2);  // the loaded state matters: the control
    }
}

}  // namespace

TEST_CASE("powersgd kernels: generic orthogonalisation == CPU loop to float tolerance, 3 ranks") {
  check({make("{rank: 2, start_iter: 2, min_compression_rate: 0}"),
         // a fresh host-drawn Q every step (the generic path copies it over)
         make("{rank: 3, start_iter: 1, warm_start: false, min_compression_rate: 0, seed: 5}"),
         make("{rank: 4, start_iter: 0, min_compression_rate: 0}", true)},
        3);
}

TEST_CASE("powersgd kernels: 2 ranks, rank 8 (full rank for the small matrices)") {
  check({make("{rank: 8, start_iter: 1, min_compression_rate: 0}")}, 2);
}

// Rough cost of each orthogonalisation on this machine's CPU (no assertion
// on time). Opt-in, 1 rank:
//   DISTOPT_KERNELS_BENCH=1 build/bin/powersgd_kernels_test -tc='*bench*'
TEST_CASE("powersgd kernels: bench (opt-in)") {
  if (!std::getenv("DISTOPT_KERNELS_BENCH")) return;
  k::Case c = make("{rank: 4, start_iter: 0}");
  c.buckets = {{{"fc1.weight", {1024, 784}}, {"fc1.bias", {1024}}},
               {{"fc2.weight", {256, 1024}}, {"fc2.bias", {256}}, {"fc3.weight", {10, 256}}}};
  c.save_at = 5;
  c.steps = 10;
  auto res = k::run_all({c}, 1);
  REQUIRE(res.size() == 1);
  MESSAGE("powersgd rank 4: cpu loop " << res[0][0].ms_a / 10 << " ms/step, generic "
                                       << res[0][0].ms_b / 10 << " ms/step");
}

TEST_CASE("powersgd kernels: cpu refuses a device bucket at create, naming the option") {
  const int port = distopt::test::free_port();
  auto codes = distopt::test::fork_ranks(1, [&](int) {
    auto ep = distopt::test::make_endpoint("tcp", 0, 1, port);
    const distopt::ComponentInfo& info = ep->registry.get(DOPT_KIND_REDUCER, "powersgd");
    auto opts = distopt::Options::validate(YAML::Load("{kernels: cpu}"), info.options, "<test>",
                                           "reducer.options");
    float x[64] = {};
    int64_t n = 64, shape[2] = {8, 8};
    dopt_bucket_entry e{};
    e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
    e.name = "w";
    e.numel = 64;
    e.ndim = 2;
    e.shape = shape;
    DLTensor dl{};
    dl.data = x;  // never dereferenced: refused before
    dl.device = {kDLCUDA, 0};
    dl.ndim = 1;
    dl.dtype = DLDataType{kDLFloat, 32, 1};
    dl.shape = &n;
    dopt_bucket b{};
    b.struct_size = DOPT_BUCKET_STRUCT_SIZE;
    b.flat = &dl;
    b.entries = &e;
    b.num_entries = 1;
    dopt_create_args a{};
    a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    a.world_size = 1;
    a.local_world_size = 1;
    a.options = opts.c_handle();
    a.scope = "t";
    dopt_reducer* red = nullptr;
    auto* vt = static_cast<const dopt_reducer_v1*>(info.vtable);
    const dopt_status st = vt->create(&a, ep->comm->ref(), &b, 1, &red);
    const std::string msg = distopt::take_last_error();
    return st == DOPT_ERR_UNSUPPORTED && msg.find("kernels: cpu") != std::string::npos ? 0 : 1;
  });
  CHECK(codes[0] == 0);
}
