// Counter-based synthetic images (see synthetic.hpp).
#include "train/synthetic.hpp"

#include <cmath>

#include "distopt/error.hpp"

namespace distopt::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

// The 64-bit constants as the int64 values with the same bits.
int64_t bits(uint64_t v) { return static_cast<int64_t>(v); }

// x >> s as an unsigned shift (at's >> on int64 is arithmetic).
at::Tensor shr(const at::Tensor& x, int s) {
  return at::bitwise_and(at::__rshift__(x, s), bits((uint64_t{1} << (64 - s)) - 1));
}

// Uniform in [0, 1) from the top 24 bits: exact in float32 on every device.
at::Tensor unit(const at::Tensor& h) { return shr(h, 40).to(at::kFloat).mul_(1.0f / 16777216.0f); }

uint64_t splitmix64_u(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

at::Tensor splitmix64(const at::Tensor& x) {
  at::Tensor z = x.add(bits(0x9E3779B97F4A7C15ull));
  z = at::bitwise_xor(z, shr(z, 30)).mul_(bits(0xBF58476D1CE4E5B9ull));
  z = at::bitwise_xor(z, shr(z, 27)).mul_(bits(0x94D049BB133111EBull));
  return at::bitwise_xor(z, shr(z, 31));
}

SyntheticData::SyntheticData(const SyntheticSpec& s) : spec_(s) {
  if (s.train_samples < 1 || s.test_samples < 1 || s.channels < 1 || s.height < 1 || s.width < 1 ||
      s.classes < 2 || !(s.noise >= 0))
    throw Error(
        "train.synthetic: samples, channels, height and width must be >= 1, classes >= 2 "
        "and noise >= 0");
  // The class patterns: a fixed draw from the seed, by the same hash on
  // scalars (so other implementations, e.g. tools/bench, can reproduce it).
  auto u01 = [&](uint64_t counter) {
    return static_cast<double>(
               splitmix64_u(static_cast<uint64_t>(s.seed) * 0x2545F4914F6CDD1Dull + counter) >>
               11) *
           (1.0 / 9007199254740992.0);
  };
  for (int64_t k = 0; k < s.classes; ++k) {
    // Orientations spread over [0, pi) (a cosine at t and t + pi is the same
    // texture under a random phase); frequency 2 or 3 cycles per image.
    const double t = kPi * static_cast<double>(k) / static_cast<double>(s.classes);
    const double f = 2.0 + static_cast<double>(k % 2);
    fr_.push_back(static_cast<float>(f * std::cos(t)));
    fc_.push_back(static_cast<float>(f * std::sin(t)));
    for (int64_t c = 0; c < s.channels; ++c) {
      const uint64_t n = static_cast<uint64_t>(k * s.channels + c);
      const double a = 0.5 + u01(2 * n);
      amp_.push_back(static_cast<float>(u01(2 * n + 1) < 0.5 ? -a : a));
    }
  }
}

SyntheticData::Patterns SyntheticData::patterns_on(const at::Device& dev) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = on_device_.find(dev.str());
  if (it != on_device_.end()) return it->second;
  const int64_t K = spec_.classes, C = spec_.channels;
  auto host = [](const std::vector<float>& v, at::IntArrayRef shape) {
    return at::from_blob(const_cast<float*>(v.data()), shape, at::kFloat).clone();
  };
  Patterns p{host(fr_, {K}).to(dev), host(fc_, {K}).to(dev), host(amp_, {K, C}).to(dev)};
  on_device_.emplace(dev.str(), p);
  return p;
}

at::Tensor SyntheticData::labels(const at::Tensor& index, bool test) const {
  // Key of sample i: (seed, split, i) packed so no two collide for i < 2^40.
  const at::Tensor key = index.to(at::kLong)
                             .add(test ? int64_t{1} << 40 : 0)
                             .add(spec_.seed * bits(0xD1B54A32D192ED03ull));
  return at::remainder(shr(splitmix64(key), 1), spec_.classes);
}

std::pair<at::Tensor, at::Tensor> SyntheticData::batch(const at::Tensor& index, bool test) const {
  const SyntheticSpec& s = spec_;
  const auto dev = index.device();
  const int64_t B = index.numel();
  const int64_t C = s.channels, H = s.height, W = s.width, per = C * H * W;
  at::Tensor y = labels(index, test);
  const at::Tensor key = index.to(at::kLong)
                             .add(test ? int64_t{1} << 40 : 0)
                             .add(s.seed * bits(0xD1B54A32D192ED03ull));
  // Per-sample phase from a second stream of the same key.
  at::Tensor phase = unit(splitmix64(splitmix64(key).add(1))).mul_(2 * kPi);  // [B]
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(dev);
  const Patterns pat = patterns_on(dev);
  const at::Tensor &fr = pat.fr, &fc = pat.fc, &amp = pat.amp;
  at::Tensor r = at::arange(H, fopt).div_(static_cast<double>(H)).view({1, H, 1});
  at::Tensor q = at::arange(W, fopt).div_(static_cast<double>(W)).view({1, 1, W});
  at::Tensor arg = fr.index_select(0, y).view({B, 1, 1}) * r +
                   fc.index_select(0, y).view({B, 1, 1}) * q;  // [B, H, W] cycles
  at::Tensor wave = at::cos(arg.mul_(2 * kPi).add_(phase.view({B, 1, 1})));
  at::Tensor x = amp.index_select(0, y).view({B, C, 1, 1}) * wave.unsqueeze(1);  // [B,C,H,W]
  if (s.noise > 0) {
    // Element e of sample i: hash of (hash(key_i), e); uniform, variance 1.
    at::Tensor elem = at::arange(per, at::TensorOptions().dtype(at::kLong).device(dev));
    at::Tensor h =
        splitmix64(splitmix64(key).add(2).view({B, 1}).mul(bits(0x100000001B3ull)) + elem);
    x.add_(
        unit(h).sub_(0.5f).mul_(static_cast<float>(std::sqrt(12.0) * s.noise)).view({B, C, H, W}));
  }
  return {x, y};
}

}  // namespace distopt::train
