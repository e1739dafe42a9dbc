// `dataset: synthetic` (tools/distopt/train/synthetic.hpp) and the resnet
// model: determinism, independence of the batch, difference between the
// samples that different ranks draw, label balance, noise level, shapes.
#include "train/synthetic.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "distopt/error.hpp"
#include "train/models.hpp"

using distopt::train::make_model;
using distopt::train::parameter_count;
using distopt::train::splitmix64;
using distopt::train::SyntheticData;
using distopt::train::SyntheticSpec;

namespace {

// splitmix64's finaliser on unsigned 64-bit integers (the reference).
uint64_t splitmix64_ref(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

SyntheticSpec small_spec() {
  SyntheticSpec s;
  s.train_samples = 4096;
  s.test_samples = 512;
  s.channels = 3;
  s.height = 12;
  s.width = 10;
  s.classes = 10;
  s.noise = 1.0;
  s.seed = 7;
  return s;
}

at::Tensor idx(std::vector<int64_t> v) { return at::tensor(at::ArrayRef<int64_t>(v), at::kLong); }

}  // namespace

TEST_CASE("splitmix64 on int64 tensors matches the unsigned reference, negatives included") {
  std::vector<int64_t> in = {0, 1, 2, 12345, -1, INT64_MIN, INT64_MAX, -987654321};
  at::Tensor out = splitmix64(idx(in));
  for (size_t i = 0; i < in.size(); ++i)
    CHECK(static_cast<uint64_t>(out[static_cast<int64_t>(i)].item<int64_t>()) ==
          splitmix64_ref(static_cast<uint64_t>(in[i])));
}

TEST_CASE("synthetic samples: shapes, identical across generators, independent of the batch") {
  SyntheticData a(small_spec()), b(small_spec());
  auto [x, y] = a.batch(idx({0, 5, 4095, 17}), false);
  CHECK((x.sizes() == at::IntArrayRef({4, 3, 12, 10})));
  CHECK((x.scalar_type() == at::kFloat));
  CHECK((y.sizes() == at::IntArrayRef({4})));
  CHECK((y.scalar_type() == at::kLong));
  // Another generator with the same spec (another run): the same bytes.
  auto [x2, y2] = b.batch(idx({0, 5, 4095, 17}), false);
  CHECK(at::equal(x, x2));
  CHECK(at::equal(y, y2));
  // Sample 5 alone equals sample 5 drawn in a batch (a rank's slice does not
  // depend on the rest of the global batch).
  auto [x5, y5] = a.batch(idx({5}), false);
  CHECK(at::equal(x5[0], x[1]));
  CHECK(y5[0].item<int64_t>() == y[1].item<int64_t>());
  CHECK(at::equal(a.labels(idx({0, 5, 4095, 17}), false), y));
  // Another seed: other data; the test split differs from the train split.
  SyntheticSpec s = small_spec();
  s.seed = 8;
  CHECK_FALSE(at::equal(SyntheticData(s).batch(idx({0, 5}), false).first, x.slice(0, 0, 2)));
  CHECK_FALSE(at::equal(a.batch(idx({0, 5}), true).first, x.slice(0, 0, 2)));
}

TEST_CASE("synthetic: the slices of two ranks differ, and no two samples are equal") {
  // distopt train gives rank r samples perm[step*W*B + r*B ...]: disjoint
  // index sets; their images must differ.
  SyntheticData d(small_spec());
  auto [r0, l0] = d.batch(at::arange(0, 64, at::kLong), false);
  auto [r1, l1] = d.batch(at::arange(64, 128, at::kLong), false);
  CHECK_FALSE(at::equal(r0, r1));
  auto [all, labels] = d.batch(at::arange(0, 256, at::kLong), false);
  auto flat = all.flatten(1);
  auto dist = at::cdist(flat, flat);
  dist.fill_diagonal_(1e9);
  CHECK(dist.min().item<double>() > 1.0);
}

TEST_CASE("synthetic labels are balanced and the noise has the requested variance") {
  SyntheticSpec s = small_spec();
  SyntheticData d(s);
  at::Tensor y = d.labels(at::arange(0, 20000, at::kLong), false);
  at::Tensor counts = at::bincount(y, {}, s.classes);
  CHECK(counts.numel() == s.classes);
  CHECK(counts.min().item<int64_t>() > 1600);  // expected 2000 each
  CHECK(counts.max().item<int64_t>() < 2400);
  // x - (the same sample at noise 0) is the noise: variance noise^2.
  SyntheticSpec quiet = s;
  quiet.noise = 0;
  s.noise = 0.5;
  auto ix = at::arange(0, 512, at::kLong);
  at::Tensor n =
      SyntheticData(s).batch(ix, false).first - SyntheticData(quiet).batch(ix, false).first;
  CHECK(n.var().item<double>() == doctest::Approx(0.25).epsilon(0.03));
  CHECK(n.mean().item<double>() == doctest::Approx(0).epsilon(0.01));
  CHECK(n.abs().max().item<double>() <= 0.5 * 1.7320509 + 1e-5);  // uniform: |u| <= sqrt(3) std
}

TEST_CASE("synthetic: the same samples as tools/bench/train_vs_pytorch.py's PyTorch generator") {
  // Values printed by the Python re-implementation (torch 1.13, CPU) for
  // this spec: the benchmark compares distopt and PyTorch on identical data.
  SyntheticData d(small_spec());
  auto [x, y] = d.batch(idx({0, 5, 4095, 17}), false);
  CHECK(y[0].item<int64_t>() == 7);
  CHECK(y[1].item<int64_t>() == 5);
  CHECK(y[2].item<int64_t>() == 4);
  CHECK(y[3].item<int64_t>() == 8);
  const float row0[] = {-1.54755f, -1.78461f, -1.6407f, 0.71498f};
  for (int i = 0; i < 4; ++i)
    CHECK(x[0][0][0][i].item<float>() == doctest::Approx(row0[i]).epsilon(1e-4));
  const float row3[] = {-0.40077f, 0.81065f, -0.91113f, 0.4882f};
  for (int i = 0; i < 4; ++i)
    CHECK(x[3][2][11][6 + i].item<float>() == doctest::Approx(row3[i]).epsilon(1e-4));
  auto [xt, yt] = d.batch(idx({3}), true);
  CHECK(yt[0].item<int64_t>() == 3);
  const float test_row[] = {0.18014f, 0.29514f, 0.47124f};
  for (int i = 0; i < 3; ++i)
    CHECK(xt[0][1][5][i].item<float>() == doctest::Approx(test_row[i]).epsilon(1e-4));
}

TEST_CASE("synthetic: a bad spec is refused") {
  SyntheticSpec s = small_spec();
  s.classes = 1;
  CHECK_THROWS_AS(SyntheticData{s}, distopt::Error);
}

TEST_CASE("resnet: output shape, ResNet-18's parameter count at width 64, same seed same weights") {
  auto m = make_model("resnet", 3, 16, 16, 10, 0, 8);
  CHECK((m->forward(at::randn({2, 3, 16, 16})).sizes() == at::IntArrayRef({2, 10})));
  // Torchvision's resnet18 (BatchNorm) has 11,689,512 parameters with 1000
  // classes and a 7x7 stem; the CIFAR variant here with GroupNorm (same
  // affine parameter count) and 10 classes: 11,173,962.
  CHECK(parameter_count(*make_model("resnet", 3, 32, 32, 10, 0, 64)) == 11173962);
  auto m2 = make_model("resnet", 3, 16, 16, 10, 0, 8);
  auto p1 = m->parameters(), p2 = m2->parameters();
  REQUIRE(p1.size() == p2.size());
  for (size_t i = 0; i < p1.size(); ++i) CHECK(at::equal(p1[i], p2[i]));
  CHECK_THROWS_AS(make_model("resnet", 3, 4, 4, 10, 0, 8), distopt::Error);
  CHECK_THROWS_AS(make_model("vgg", 3, 16, 16, 10, 0, 8), distopt::Error);
}
