// `dataset: synthetic`: labelled images generated on the fly, on any device,
// as a pure function of (seed, sample index): no file, any sample count and
// shape, and the same samples on every run (on another device: up to rounding).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace distopt::train {

/// Shape and difficulty of a synthetic dataset (train.synthetic in YAML).
struct SyntheticSpec {
  int64_t train_samples = 50000;
  int64_t test_samples = 10000;
  int64_t channels = 3, height = 32, width = 32;
  int64_t classes = 10;
  double noise = 1.0;  ///< std of the additive noise; the pattern's amplitude is ~1
  int64_t seed = 0;    ///< train.seed: the class patterns and every sample
};

/// Generates samples. Sample i of a split is label y_i = h(i) mod classes and
/// image x_i[c, r, q] = a_{y,c} * cos(2 pi (f_y (r cos t_y / H + q sin t_y / W))
/// + phi_i) + noise * u_i[c, r, q], where t_y (orientation), f_y (frequency,
/// 2 or 3 cycles) and a_{y,c} (per-channel amplitude in +-[0.5, 1.5]) are the
/// class's fixed pattern drawn from the seed, phi_i is a per-sample random
/// phase and u_i is unit-variance uniform noise; h and u come from a
/// counter-based hash (splitmix64 on int64 tensor ops) of (seed, split, i,
/// element), so a sample does not depend on which other samples are drawn, on
/// the batch, on the rank or on the device (up to cos's last bits). A
/// classifier must tell the classes apart by orientation and frequency
/// (translation-invariant textures, which a CNN learns quickly); the noise
/// sets how hard that is. Thread-safe (const; no global RNG is touched).
class SyntheticData {
 public:
  /// Throws distopt::Error when a count or a dimension is < 1, classes < 2
  /// or noise < 0.
  explicit SyntheticData(const SyntheticSpec& spec);
  const SyntheticSpec& spec() const { return spec_; }

  /// Samples `index` (int64 [B], any device; meant to be in [0, count of the
  /// split), not checked: any int64 below 2^40 names a distinct sample)
  /// of the train (test = false) or test split: images float32 [B, channels,
  /// height, width] and labels int64 [B], on index's device.
  std::pair<at::Tensor, at::Tensor> batch(const at::Tensor& index, bool test) const;

  /// Labels only (int64 [B] on index's device), as batch() returns them.
  at::Tensor labels(const at::Tensor& index, bool test) const;

 private:
  struct Patterns {
    at::Tensor fr, fc, amp;
  };
  // The class patterns on `dev`, copied there once: a copy from pageable
  // host memory per batch would stall the device's queue every step.
  Patterns patterns_on(const at::Device& dev) const;

  SyntheticSpec spec_;
  std::vector<float> amp_;      // [classes, channels]
  std::vector<float> fr_, fc_;  // [classes]: cycles per image along rows / columns
  mutable std::mutex mu_;
  mutable std::map<std::string, Patterns> on_device_;  // by Device::str()
};

/// The hash behind SyntheticData (exposed for tests): splitmix64's finaliser
/// of each int64 element (two's-complement wrap-around), on its device.
at::Tensor splitmix64(const at::Tensor& x);

}  // namespace distopt::train
