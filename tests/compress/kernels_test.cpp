// The `compress` reducers' device-generic path (libtorch ops, what CUDA
// buckets run) against their CPU kernels, both on host buckets, on 2 and 3
// real processes (kernels_harness.hpp): every output bit-identical, the same
// checkpoint state (keys, shapes, bits), a checkpoint written by either path
// loads into the other and continues bit-identically, the same bytes_sent.
// Torch-free (the parent keeps forking).
#include <doctest/doctest.h>

#include <cstdlib>

#include "kernels_harness.hpp"

namespace {

namespace k = distopt::test::kernels;

// Odd lengths (bit-packing tails, a 1-element tensor), padding between
// entries, one tensor large enough for topk's sampled threshold on the CPU
// (n / 4096 >= 4), matrices and a 4-D weight.
const std::vector<k::BucketSpec> kBuckets = {
    {{"fc2.weight", {8, 24}}, {"fc2.bias", {9}}, {"one", {1}}},
    {{"fc1.weight", {160, 128}}, {"fc1.bias", {13}}, {"conv.weight", {6, 2, 3, 3}}}};

k::Case make(const std::string& reducer, const std::string& options, bool f64 = false,
             bool ties = false) {
  k::Case c;
  c.reducer = reducer;
  c.options = options;
  c.buckets = kBuckets;
  c.f64 = f64;
  c.ties = ties;
  return c;
}

bool stateful(const k::Case& c) {
  if (c.reducer == "fp16" || c.reducer == "bf16") return false;
  if (c.reducer == "signsgd")
    return c.options.find("error_feedback: true") != std::string::npos ||
           c.options.find("momentum: 0.") != std::string::npos;
  if (c.reducer == "topk")  // residuals (default on), velocities
    return c.options.find("error_feedback: false") == std::string::npos ||
           c.options.find("momentum: 0.") != std::string::npos;
  return true;  // randomk: its draw count at least
}

void check(const std::vector<k::Case>& cases, int world) {
  auto res = k::run_all(cases, world);
  REQUIRE(res.size() == static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const k::Case& c = cases[i];
      const k::Summary& s = res[static_cast<size_t>(r)][i];
      CAPTURE(r);
      CAPTURE(c.reducer);
      CAPTURE(c.options);
      CAPTURE(c.f64);
      CAPTURE(c.ties);
      CAPTURE(s.keys);
      CHECK(s.ab_bits == 0);  // generic == CPU kernels, every step, bit for bit
      CHECK(s.store_bits == 0);
      CHECK(s.same_keys);
      CHECK(s.ca_bits == 0);  // CPU checkpoint -> generic path
      CHECK(s.db_bits == 0);  // generic checkpoint -> CPU kernels
      CHECK(s.bytes_a == s.bytes_b);
      CHECK(s.hash_a == res[0][i].hash_a);  // every rank ends with the same buckets
      CHECK(s.hash_b == res[0][i].hash_b);
      CHECK(s.bytes_a > 0);
      if (stateful(c)) {
        CHECK(!s.keys.empty());
        CHECK(s.fresh_diff > 1e-3);  // without the loaded state the run is another one
      } else {
        CHECK(s.keys.empty());
        CHECK(s.fresh_diff == 0);
      }
    }
}

}  // namespace

TEST_CASE("compress kernels: generic path == CPU kernels on 3 ranks; checkpoints cross over") {
  check({make("fp16", "{}"), make("fp16", "{}", true), make("bf16", "{}"),
         make("signsgd", "{error_feedback: true}"),
         make("signsgd", "{error_feedback: true, momentum: 0.9}", true),
         make("signsgd", "{error_feedback: false}"), make("topk", "{ratio: 0.1, min_k: 1}"),
         make("topk", "{ratio: 0.05, min_k: 8, momentum: 0.9}", false, true),
         make("topk", "{ratio: 0.1, min_k: 1, error_feedback: false}", true),
         make("randomk", "{ratio: 0.1, min_k: 1, seed: 7}"),
         make("randomk", "{ratio: 0.2, min_k: 1, momentum: 0.9, momentum_masking: false}", true)},
        3);
}

TEST_CASE("compress kernels: 2 ranks (signsgd's tied votes, topk ties)") {
  check({make("signsgd", "{error_feedback: true}", false, true),
         make("topk", "{ratio: 0.1, min_k: 1}", false, true),
         make("randomk", "{ratio: 0.5, min_k: 1}")},
        2);
}

TEST_CASE("compress kernels: cpu refuses device buckets at create, naming the option") {
  const int port = distopt::test::free_port();
  auto codes = distopt::test::fork_ranks(1, [&](int) {
    auto ep = distopt::test::make_endpoint("tcp", 0, 1, port);
    for (const char* name : {"fp16", "bf16", "signsgd", "topk", "randomk"}) {
      const distopt::ComponentInfo& info = ep->registry.get(DOPT_KIND_REDUCER, name);
      auto opts = distopt::Options::validate(YAML::Load("{kernels: cpu}"), info.options, "<test>",
                                             "reducer.options");
      float x[8] = {};
      int64_t n = 8, shape = 8;
      dopt_bucket_entry e{};
      e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
      e.name = "w";
      e.numel = 8;
      e.ndim = 1;
      e.shape = &shape;
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
      if (st != DOPT_ERR_UNSUPPORTED || msg.find("kernels: cpu") == std::string::npos) return 1;
    }
    // The schema knows the three values only.
    const distopt::ComponentInfo& info = ep->registry.get(DOPT_KIND_REDUCER, "topk");
    try {
      distopt::Options::validate(YAML::Load("{kernels: cuda}"), info.options, "<test>",
                                 "reducer.options");
      return 2;
    } catch (const distopt::ConfigError&) {
    }
    return 0;
  });
  CHECK(codes[0] == 0);
}

// Rough cost of each path on this machine's CPU (no assertion on time): why
// `kernels: auto` keeps the CPU kernels for host buckets. Opt-in, 1 rank:
//   DISTOPT_KERNELS_BENCH=1 build/bin/compress_kernels_test -tc='*bench*'
TEST_CASE("compress kernels: bench (opt-in)") {
  if (!std::getenv("DISTOPT_KERNELS_BENCH")) return;
  // ~1.1 M elements in 2 buckets: an mlp's gradients.
  const std::vector<k::BucketSpec> big = {{{"fc1.weight", {1024, 784}}, {"fc1.bias", {1024}}},
                                          {{"fc2.weight", {256, 1024}}, {"fc2.bias", {256}}}};
  std::vector<k::Case> cases;
  for (const char* r : {"fp16", "bf16", "signsgd", "topk", "randomk"}) {
    k::Case c = make(r, std::string(r) == "signsgd" ? "{error_feedback: true}" : "{}");
    c.buckets = big;
    c.save_at = 5;
    c.steps = 10;
    cases.push_back(c);
  }
  auto res = k::run_all(cases, 1);
  REQUIRE(res.size() == 1);
  for (size_t i = 0; i < cases.size(); ++i)
    MESSAGE(cases[i].reducer << ": cpu kernels " << res[0][i].ms_a / 10 << " ms/step, generic "
                             << res[0][i].ms_b / 10 << " ms/step");
}
