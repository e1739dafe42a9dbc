// The `compress` reducers on real processes over loopback (tcp communicator),
// driven through the reducer ABI exactly as the host drives them: create with
// the buckets, reduce every bucket, wait. Each rank writes what its buckets
// held after every step; the parent compares against references it computes
// itself from all ranks' gradients. Torch-free.
#include "distopt/reducer.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bitpack.hpp"  // plugins/compress: the signsgd wire format
#include "comm_helpers.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "result_files.hpp"

namespace {

using distopt::test::fork_ranks;
using distopt::test::free_port;
using distopt::test::make_endpoint;
namespace pc = distopt::plugins::compress;

using Grad = std::vector<std::vector<float>>;  // per bucket, the flat buffer

// Two buckets; entries of odd lengths (bit packing tails) at 4-element
// aligned offsets, so there is padding between them; one large enough for
// topk's sampled threshold path (n / 4096 >= 4).
const std::vector<std::vector<size_t>> kEntries = {{13, 1, 100, 9}, {7, 64, 20000}};

struct Layout {
  std::vector<std::vector<size_t>> offsets;
  std::vector<size_t> lengths;
};
Layout layout() {
  Layout l;
  for (const auto& b : kEntries) {
    std::vector<size_t> off;
    size_t o = 0;
    for (size_t n : b) {
      off.push_back(o);
      o = (o + n + 3) / 4 * 4;
    }
    l.offsets.push_back(off);
    l.lengths.push_back(o);
  }
  return l;
}

// Rank r's gradient at step s: N(0, 1) with per-entry scales; padding 0;
// steps >= zero_from are all zero (to drain error-feedback residuals).
Grad gradient(int rank, int step, int zero_from) {
  Layout l = layout();
  Grad g(kEntries.size());
  std::mt19937 gen(1000u * static_cast<unsigned>(rank) + static_cast<unsigned>(step) + 17u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t b = 0; b < kEntries.size(); ++b) {
    g[b].assign(l.lengths[b], 0.0f);
    for (size_t e = 0; e < kEntries[b].size(); ++e)
      for (size_t i = 0; i < kEntries[b][e]; ++i)
        g[b][l.offsets[b][e] + i] = step >= zero_from ? 0.0f : nd(gen) * static_cast<float>(e + 1);
  }
  return g;
}

struct RankResult {
  std::vector<Grad> steps;  // after each step
  double bytes_sent = -1;
};

// Run `name` with `options` on `world` ranks for `steps` steps.
std::vector<RankResult> run(const std::string& name, const std::string& options, int world,
                            int steps, int zero_from = 1 << 30,
                            DLDataType dtype = {kDLFloat, 32, 1}) {
  char tmpl[] = "/tmp/distopt_compress_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const int port = free_port();
  auto codes = fork_ranks(world, [&](int rank) {
    auto ep = make_endpoint("tcp", rank, world, port);
    const distopt::ComponentInfo& info = ep->registry.get(DOPT_KIND_REDUCER, name);
    // These tensors are tiny: min_k 1 unless a test sets it, so that k
    // follows the ratio (the default min_k would send most of them whole).
    YAML::Node yopts = YAML::Load(options);
    if ((name == "topk" || name == "randomk") && !yopts["min_k"]) yopts["min_k"] = 1;
    auto opts = distopt::Options::validate(yopts, info.options, "<test>", "reducer.options");
    Layout l = layout();
    const size_t nb = kEntries.size();
    std::vector<std::vector<uint16_t>> half(nb);  // storage for 16-bit buckets
    std::vector<std::vector<float>> flat(nb);
    std::vector<int64_t> flat_shape(nb);
    std::vector<std::vector<int64_t>> shapes(nb);
    std::vector<std::vector<dopt_bucket_entry>> entries(nb);
    std::vector<DLTensor> dl(nb);
    std::vector<dopt_bucket> buckets(nb);
    const bool is16 = dtype.bits == 16;
    for (size_t b = 0; b < nb; ++b) {
      flat[b].assign(l.lengths[b], 0.0f);
      half[b].assign(l.lengths[b], 0);
      flat_shape[b] = static_cast<int64_t>(l.lengths[b]);
      shapes[b].assign(kEntries[b].begin(), kEntries[b].end());
      for (size_t e = 0; e < kEntries[b].size(); ++e) {
        dopt_bucket_entry en{};
        en.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
        en.name = "p";
        en.param_index = static_cast<int32_t>(e);
        en.offset = l.offsets[b][e];
        en.numel = kEntries[b][e];
        en.ndim = 1;
        en.shape = &shapes[b][e];
        entries[b].push_back(en);
      }
      dl[b] = DLTensor{};
      dl[b].data = is16 ? static_cast<void*>(half[b].data()) : static_cast<void*>(flat[b].data());
      dl[b].device = {kDLCPU, 0};
      dl[b].ndim = 1;
      dl[b].dtype = dtype;
      dl[b].shape = &flat_shape[b];
      buckets[b].struct_size = DOPT_BUCKET_STRUCT_SIZE;
      buckets[b].index = static_cast<int32_t>(b);
      buckets[b].flat = &dl[b];
      buckets[b].entries = entries[b].data();
      buckets[b].num_entries = entries[b].size();
    }
    dopt_create_args a{};
    a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    a.rank = rank;
    a.world_size = world;
    a.local_rank = rank;
    a.local_world_size = world;
    a.options = opts.c_handle();
    a.store = reinterpret_cast<dopt_store*>(ep->store.get());
    a.scope = "test/reducer";
    a.job_token = "test-token";
    a.bind_address = "127.0.0.1";
    auto* vt = static_cast<const dopt_reducer_v1*>(info.vtable);
    dopt_reducer* red = nullptr;
    distopt::check_status(vt->create(&a, ep->comm->ref(), buckets.data(), nb, &red), name,
                          "create");
    std::ofstream out(dir + "/rank" + std::to_string(rank), std::ios::binary);
    for (int s = 0; s < steps; ++s) {
      Grad g = gradient(rank, s, zero_from);
      for (size_t b = 0; b < nb; ++b) {
        flat[b] = g[b];
        if (is16) {  // the test only feeds 16-bit buckets through bf16 (exact upper halves)
          for (size_t i = 0; i < flat[b].size(); ++i) {
            uint32_t u;
            std::memcpy(&u, &flat[b][i], 4);
            half[b][i] = static_cast<uint16_t>(u >> 16);
          }
        }
      }
      std::vector<dopt_reduce_request*> reqs(nb);
      for (size_t b = 0; b < nb; ++b)
        distopt::check_status(vt->reduce(red, &buckets[b], &reqs[b]), name, "reduce");
      for (size_t b = 0; b < nb; ++b) {
        distopt::check_status(vt->wait(reqs[b], 30000), name, "wait");
        vt->request_free(reqs[b]);
        if (is16)
          for (size_t i = 0; i < flat[b].size(); ++i) {
            uint32_t u = static_cast<uint32_t>(half[b][i]) << 16;
            std::memcpy(&flat[b][i], &u, 4);
          }
        out.write(reinterpret_cast<const char*>(flat[b].data()),
                  static_cast<std::streamsize>(flat[b].size() * sizeof(float)));
      }
    }
    double bytes = static_cast<double>(vt->bytes_sent(red));
    out.write(reinterpret_cast<const char*>(&bytes), sizeof bytes);
    out.close();
    distopt::check_status(vt->destroy(red), name, "destroy");
    ep->comm->barrier().wait();
    return 0;
  });
  std::vector<RankResult> res(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[static_cast<size_t>(r)] == 0);
    std::ifstream in(dir + "/rank" + std::to_string(r), std::ios::binary);
    Layout l = layout();
    for (int s = 0; s < steps; ++s) {
      Grad g(kEntries.size());
      for (size_t b = 0; b < kEntries.size(); ++b) {
        g[b].resize(l.lengths[b]);
        in.read(reinterpret_cast<char*>(g[b].data()),
                static_cast<std::streamsize>(g[b].size() * sizeof(float)));
      }
      res[static_cast<size_t>(r)].steps.push_back(g);
    }
    in.read(reinterpret_cast<char*>(&res[static_cast<size_t>(r)].bytes_sent), sizeof(double));
    REQUIRE(in.good());
  }
  distopt::test::remove_tree(dir);
  return res;
}

double max_diff(const Grad& a, const Grad& b) {
  double m = 0;
  for (size_t x = 0; x < a.size(); ++x)
    for (size_t i = 0; i < a[x].size(); ++i)
      m = std::max(m, std::fabs(double(a[x][i]) - double(b[x][i])));
  return m;
}

// Every rank ended every step with bit-identical buckets.
void check_same_on_every_rank(const std::vector<RankResult>& res) {
  for (size_t r = 1; r < res.size(); ++r)
    for (size_t s = 0; s < res[0].steps.size(); ++s) {
      CAPTURE(r);
      CAPTURE(s);
      CHECK(max_diff(res[r].steps[s], res[0].steps[s]) == 0.0);
    }
}

Grad exact_mean(int world, int step, int zero_from = 1 << 30) {
  Grad m = gradient(0, step, zero_from);
  for (auto& b : m) std::fill(b.begin(), b.end(), 0.0f);
  std::vector<std::vector<double>> acc(m.size());
  for (size_t b = 0; b < m.size(); ++b) acc[b].assign(m[b].size(), 0.0);
  for (int r = 0; r < world; ++r) {
    Grad g = gradient(r, step, zero_from);
    for (size_t b = 0; b < m.size(); ++b)
      for (size_t i = 0; i < m[b].size(); ++i) acc[b][i] += g[b][i];
  }
  for (size_t b = 0; b < m.size(); ++b)
    for (size_t i = 0; i < m[b].size(); ++i) m[b][i] = static_cast<float>(acc[b][i] / world);
  return m;
}

size_t keep(double ratio, size_t n) {  // the documented k with min_k 1: max(1, ceil(ratio x n))
  return std::min(
      n, std::max<size_t>(1, static_cast<size_t>(std::ceil(ratio * static_cast<double>(n)))));
}

uint64_t ring(uint64_t bytes, int w) {
  return 2 * bytes * static_cast<uint64_t>(w - 1) / static_cast<uint64_t>(w);
}

}  // namespace

TEST_CASE("signsgd packing round-trips, odd lengths included") {
  std::mt19937 gen(7);
  std::normal_distribution<float> nd;
  for (size_t n : {0, 1, 7, 8, 9, 13, 63, 64, 65, 1001}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(gen);
    if (n > 3) x[2] = 0.0f;  // +0 reads as +1
    std::vector<uint8_t> packed(pc::packed_bytes(n) + 1, 0xAB);
    pc::pack_signs(x.data(), n, packed.data());
    CHECK(pc::packed_bytes(n) == (n + 7) / 8);
    CHECK(packed[pc::packed_bytes(n)] == 0xAB);  // nothing written past the run
    for (size_t i = 0; i < n; ++i)
      CHECK(pc::unpack_sign(packed.data(), i) == (x[i] < 0 ? -1.0f : 1.0f));
    if (n % 8) CHECK((packed[n / 8] >> (n % 8)) == 0);  // unused tail bits are 0
  }
}

// Reference EF-SignSGD / signSGD-with-majority-vote as documented in
// signsgd_reducer.hpp, simulating every rank.
std::vector<Grad> sign_reference(int world, int steps, bool ef) {
  Layout l = layout();
  std::vector<Grad> resid(static_cast<size_t>(world));
  for (auto& r : resid) {
    r = gradient(0, 0, 0);  // zeros of the right shape
  }
  std::vector<Grad> outs;
  for (int s = 0; s < steps; ++s) {
    Grad out = gradient(0, 0, 0);
    for (size_t b = 0; b < kEntries.size(); ++b)
      for (size_t e = 0; e < kEntries[b].size(); ++e) {
        const size_t off = l.offsets[b][e], n = kEntries[b][e];
        std::vector<std::vector<float>> p(static_cast<size_t>(world));
        float scale_sum = 0;
        for (int r = 0; r < world; ++r) {
          Grad g = gradient(r, s, 1 << 30);
          auto& pr = p[static_cast<size_t>(r)];
          for (size_t i = 0; i < n; ++i)
            pr.push_back(g[b][off + i] + (ef ? resid[static_cast<size_t>(r)][b][off + i] : 0));
          double a = 0;
          for (float v : pr) a += std::fabs(v);
          float sc = static_cast<float>(a / static_cast<double>(n));
          scale_sum += sc;
        }
        const float scale = scale_sum / static_cast<float>(world);
        for (size_t i = 0; i < n; ++i) {
          int votes = 0;
          for (int r = 0; r < world; ++r) votes += p[static_cast<size_t>(r)][i] < 0 ? -1 : 1;
          out[b][off + i] = votes > 0 ? scale : (votes < 0 ? -scale : 0.0f);
          // the residual is exactly what the applied update did not carry
          if (ef)
            for (int r = 0; r < world; ++r)
              resid[static_cast<size_t>(r)][b][off + i] =
                  p[static_cast<size_t>(r)][i] - out[b][off + i];
        }
      }
    outs.push_back(out);
  }
  return outs;
}

uint64_t sign_bytes_per_step(int world) {
  uint64_t msg = 0;
  for (const auto& b : kEntries) {
    msg += 4 * b.size();
    for (size_t n : b) msg += (n + 7) / 8;
  }
  return msg * static_cast<uint64_t>(world - 1);
}

TEST_CASE(
    "signsgd: majority vote over 3 ranks equals a local reference; same on every rank; bytes") {
  const int w = 3, steps = 2;
  auto res = run("signsgd", "{}", w, steps);
  auto ref = sign_reference(w, steps, false);
  for (int s = 0; s < steps; ++s)
    CHECK(max_diff(res[0].steps[static_cast<size_t>(s)], ref[static_cast<size_t>(s)]) <= 1e-6);
  check_same_on_every_rank(res);
  for (const auto& r : res)
    CHECK(r.bytes_sent == static_cast<double>(steps * sign_bytes_per_step(w)));
  // it is lossy: not the mean
  CHECK(max_diff(res[0].steps[0], exact_mean(w, 0)) > 0.1);
}

TEST_CASE("signsgd error_feedback: 2 ranks (ties vote 0) follow EF-SignSGD exactly over 5 steps") {
  const int w = 2, steps = 5;
  auto res = run("signsgd", "{error_feedback: true}", w, steps);
  auto ref = sign_reference(w, steps, true);
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    CHECK(max_diff(res[1].steps[static_cast<size_t>(s)], ref[static_cast<size_t>(s)]) <= 1e-5);
  }
  check_same_on_every_rank(res);
  // with feedback the later steps differ from plain signSGD (the residual is used)
  auto plain = sign_reference(w, steps, false);
  CHECK(max_diff(plain[2], ref[2]) > 1e-3);
  bool tie = false;
  for (float v : res[0].steps[0][0]) tie = tie || v == 0.0f;
  CHECK(tie);
}

TEST_CASE("topk with ratio 1 equals the mean; bytes = (W-1) x 8 x numel") {
  const int w = 3;
  auto res = run("topk", "{ratio: 1.0}", w, 2);
  for (int s = 0; s < 2; ++s)
    CHECK(max_diff(res[0].steps[static_cast<size_t>(s)], exact_mean(w, s)) <= 1e-6);
  check_same_on_every_rank(res);
  uint64_t n = 0;
  for (const auto& b : kEntries)
    for (size_t x : b) n += x;
  for (const auto& r : res) CHECK(r.bytes_sent == static_cast<double>(2 * (w - 1) * 8 * n));
}

// Sparse reducers with error feedback: one real gradient, then zero
// gradients. Each step sends k per tensor; what was not sent stays in the
// residual and goes out later, so once every element had its turn the sum of
// the outputs is exactly the mean of the one gradient.
void check_drains(const std::string& name, double ratio, int drain_steps, bool shared_support) {
  const int w = 2, steps = 1 + drain_steps;
  auto res = run(name, "{ratio: " + std::to_string(ratio) + "}", w, steps, 1);
  check_same_on_every_rank(res);
  Grad sum = res[0].steps[0];
  for (int s = 1; s < steps; ++s)
    for (size_t b = 0; b < sum.size(); ++b)
      for (size_t i = 0; i < sum[b].size(); ++i)
        sum[b][i] += res[0].steps[static_cast<size_t>(s)][b][i];
  CHECK(max_diff(sum, exact_mean(w, 0)) <= 1e-6);
  // step 0 is sparse: at most k per tensor per rank (exactly k with shared indices)
  Layout l = layout();
  uint64_t k_total = 0;
  for (size_t b = 0; b < kEntries.size(); ++b)
    for (size_t e = 0; e < kEntries[b].size(); ++e) {
      size_t k = keep(ratio, kEntries[b][e]), nz = 0;
      k_total += k;
      for (size_t i = 0; i < kEntries[b][e]; ++i)
        nz += res[0].steps[0][b][l.offsets[b][e] + i] != 0.0f;
      CAPTURE(e);
      if (shared_support)
        CHECK(nz == k);
      else
        CHECK((nz >= k && nz <= static_cast<size_t>(w) * k));
    }
  const double expect = shared_support ? static_cast<double>(steps * ring(4 * k_total, w))
                                       : static_cast<double>(steps * (w - 1) * 8 * k_total);
  for (const auto& r : res) CHECK(r.bytes_sent == expect);
}

TEST_CASE("topk error feedback: the residual is exactly what was not sent") {
  check_drains("topk", 0.25, 4, false);  // k = n/4 per step: 4 zero steps drain it
}

TEST_CASE("randomk error feedback: shared indices, exactly k values per tensor, residual drains") {
  check_drains("randomk", 0.5, 40,
               true);  // P(an element never drawn in 40 steps) ~ 2^-40 per element
}

TEST_CASE(
    "topk step 1 is the local top-k of each rank averaged; without error feedback nothing is "
    "kept") {
  const int w = 2;
  const double ratio = 0.2;
  auto res = run("topk", "{ratio: 0.2, error_feedback: false}", w, 2, 1);
  Layout l = layout();
  Grad ref = gradient(0, 0, 0);
  for (int r = 0; r < w; ++r) {
    Grad g = gradient(r, 0, 1 << 30);
    for (size_t b = 0; b < kEntries.size(); ++b)
      for (size_t e = 0; e < kEntries[b].size(); ++e) {
        const size_t off = l.offsets[b][e], n = kEntries[b][e], k = keep(ratio, n);
        std::vector<float> a;
        for (size_t i = 0; i < n; ++i) a.push_back(std::fabs(g[b][off + i]));
        std::sort(a.begin(), a.end(), std::greater<float>());
        for (size_t i = 0; i < n; ++i)
          if (std::fabs(g[b][off + i]) >= a[k - 1])
            ref[b][off + i] += g[b][off + i] / static_cast<float>(w);
      }
  }
  CHECK(max_diff(res[0].steps[0], ref) <= 1e-6);
  CHECK(max_diff(res[0].steps[1], gradient(0, 0, 0)) == 0.0);  // zero gradient, no memory: zero
}

TEST_CASE("fp16 and bf16 equal the mean to their precision; same on every rank; half the bytes") {
  const int w = 3;
  Layout l = layout();
  uint64_t len = 0;
  for (size_t n : l.lengths) len += n;
  for (std::string name : {"fp16", "bf16"}) {
    CAPTURE(name);
    const bool bf = name == "bf16";
    auto res = run(name, "{}", w, 2);
    check_same_on_every_rank(res);
    // W roundings of (sum_r |g_r|) / W at most (a cast per rank, W-1 partial
    // sums in 16 bits): relative 2^-11 each for fp16, 2^-8 for bf16
    const double rel = w * (bf ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11));
    bool rounded = false;
    for (int s = 0; s < 2; ++s) {
      Grad m = exact_mean(w, s);
      std::vector<Grad> g;
      for (int r = 0; r < w; ++r) g.push_back(gradient(r, s, 1 << 30));
      for (size_t b = 0; b < m.size(); ++b)
        for (size_t i = 0; i < m[b].size(); ++i) {
          double mag = 0;
          for (int r = 0; r < w; ++r) mag += std::fabs(g[static_cast<size_t>(r)][b][i]) / w;
          const double got = res[0].steps[static_cast<size_t>(s)][b][i];
          CHECK(std::fabs(got - m[b][i]) <= rel * mag + 1e-7);
          rounded = rounded || got != m[b][i];
        }
    }
    CHECK(rounded);  // it really went through 16 bits
    for (const auto& r : res) CHECK(r.bytes_sent == static_cast<double>(2 * ring(2 * len, w)));
  }
}

TEST_CASE("bf16 buckets go through topk (ratio 1) unchanged up to bf16 rounding") {
  const int w = 2;
  auto res = run("topk", "{ratio: 1.0}", w, 1, 1 << 30, DLDataType{kDLBfloat, 16, 1});
  Grad m = exact_mean(w, 0);
  for (size_t b = 0; b < m.size(); ++b)
    for (size_t i = 0; i < m[b].size(); ++i)
      CHECK(std::fabs(res[0].steps[0][b][i] - m[b][i]) <= std::fabs(m[b][i]) * 0.01 + 0.02);
  check_same_on_every_rank(res);
}

TEST_CASE("a ratio of 0 is refused by the schema, (0, 1], and at create with a message") {
  const int port = free_port();
  auto codes = fork_ranks(1, [&](int) {
    auto ep = make_endpoint("tcp", 0, 1, port);
    const distopt::ComponentInfo& info = ep->registry.get(DOPT_KIND_REDUCER, "topk");
    // The schema's open lower bound (ABI 1.2) refuses it before anything is created.
    try {
      distopt::Options::validate(YAML::Load("{ratio: 0}"), info.options, "<test>",
                                 "reducer.options");
      return 2;
    } catch (const distopt::ConfigError& e) {
      if (std::string(e.what()).find("reducer.options.ratio: value 0 is out of range (0, 1]") ==
          std::string::npos)
        return 3;
    }
    // A host that reads the bounds as inclusive (older than 1.2) lets it
    // through: the reducer refuses it itself.
    std::vector<distopt::OptionSpec> inclusive = info.options;
    for (auto& s : inclusive) s.min_exclusive = s.max_exclusive = false;
    auto opts = distopt::Options::validate(YAML::Load("{ratio: 0}"), inclusive, "<test>",
                                           "reducer.options");
    dopt_create_args a{};
    a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    a.world_size = 1;
    a.local_world_size = 1;
    a.options = opts.c_handle();
    a.scope = "t";
    dopt_reducer* red = nullptr;
    auto* vt = static_cast<const dopt_reducer_v1*>(info.vtable);
    dopt_status st = vt->create(&a, ep->comm->ref(), nullptr, 0, &red);
    std::string msg = distopt::take_last_error();
    return (st == DOPT_ERR_INVALID_ARGUMENT &&
            msg.find("ratio must be in (0, 1]") != std::string::npos)
               ? 0
               : 1;
  });
  CHECK(codes[0] == 0);
}

namespace {
// DGC momentum correction on top of top-k with error feedback, computed
// locally for every rank (Lin et al. 2018, section 3.2):
//   u = m u + g;  p = e + u;  S = top-k |p| per tensor;  e = p off S;
//   u = 0 on S (masking);  out = mean over ranks of p on S.
std::vector<Grad> topk_momentum_reference(int world, int steps, double ratio, size_t min_k, float m,
                                          bool masking) {
  Layout l = layout();
  std::vector<Grad> u(static_cast<size_t>(world)), e(static_cast<size_t>(world));
  std::vector<Grad> out;
  for (int s = 0; s < steps; ++s) {
    Grad mean = gradient(0, s, 1 << 30);
    for (auto& b : mean) std::fill(b.begin(), b.end(), 0.0f);
    for (int r = 0; r < world; ++r) {
      Grad g = gradient(r, s, 1 << 30);
      Grad& ur = u[static_cast<size_t>(r)];
      Grad& er = e[static_cast<size_t>(r)];
      if (ur.empty()) ur = er = Grad(g.size());
      for (size_t b = 0; b < g.size(); ++b) {
        ur[b].resize(g[b].size(), 0.0f);
        er[b].resize(g[b].size(), 0.0f);
        for (size_t x = 0; x < kEntries[b].size(); ++x) {
          const size_t off = l.offsets[b][x], n = kEntries[b][x];
          const size_t k = std::min(n, std::max(min_k, keep(ratio, n)));
          std::vector<float> p(n), a(n);
          for (size_t i = 0; i < n; ++i) {
            ur[b][off + i] = m * ur[b][off + i] + g[b][off + i];
            p[i] = er[b][off + i] + ur[b][off + i];
            a[i] = std::fabs(p[i]);
          }
          std::vector<float> sorted = a;
          std::sort(sorted.begin(), sorted.end(), std::greater<float>());
          for (size_t i = 0; i < n; ++i) {
            const bool sent = a[i] >= sorted[k - 1];
            er[b][off + i] = sent ? 0.0f : p[i];
            if (sent) mean[b][off + i] += p[i];
            if (sent && masking) ur[b][off + i] = 0.0f;
          }
        }
      }
    }
    for (auto& b : mean)
      for (float& v : b) v /= static_cast<float>(world);
    out.push_back(mean);
  }
  return out;
}
}  // namespace

TEST_CASE("topk momentum correction and masking follow DGC; min_k keeps small tensors sending") {
  const int w = 2, steps = 4;
  for (bool masking : {true, false}) {
    CAPTURE(masking);
    const std::string opts =
        std::string("{ratio: 0.1, min_k: 8, momentum: 0.9, momentum_masking: ") +
        (masking ? "true" : "false") + "}";
    auto res = run("topk", opts, w, steps);
    check_same_on_every_rank(res);
    auto ref = topk_momentum_reference(w, steps, 0.1, 8, 0.9f, masking);
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      CHECK(max_diff(res[0].steps[static_cast<size_t>(s)], ref[static_cast<size_t>(s)]) <= 1e-4);
    }
  }
  // Masking matters: without it the stale velocity keeps pushing.
  auto a = topk_momentum_reference(w, steps, 0.1, 8, 0.9f, true);
  auto b = topk_momentum_reference(w, steps, 0.1, 8, 0.9f, false);
  CHECK(max_diff(a[3], b[3]) > 1e-3);
  // min_k: the 9-, 13- and 64-element tensors send 8 (not 1, 2 and 7) per rank.
  auto res = run("topk", "{ratio: 0.1, min_k: 8, error_feedback: false}", w, 1);
  Layout l = layout();
  size_t nz = 0;
  for (size_t i = 0; i < kEntries[0][0]; ++i) nz += res[0].steps[0][0][l.offsets[0][0] + i] != 0;
  CHECK((nz >= 8 && nz <= 16));
}
