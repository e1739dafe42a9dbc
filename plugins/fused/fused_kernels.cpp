#include "fused_kernels.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace distopt::plugins::fused {
namespace {

// ~64K elements per task: large enough that at::parallel_for's overhead is
// noise, small enough to balance 2..16 threads on a 25M-element group.
constexpr int64_t kGrain = 1 << 16;

// Run f(segment, lo, hi) over state range [begin, end) of the chunk, split
// at segment boundaries.
template <class F>
void for_range(const Chunk& c, int64_t begin, int64_t end, F&& f) {
  const auto& s = c.segments;
  auto it = std::upper_bound(s.begin(), s.end(), begin,
                             [](int64_t v, const Segment& seg) { return v < seg.state_offset; });
  size_t k = static_cast<size_t>(it - s.begin()) - 1;
  for (; k < s.size() && s[k].state_offset < end; ++k) {
    const int64_t lo = std::max<int64_t>(begin - s[k].state_offset, 0);
    const int64_t hi = std::min<int64_t>(end - s[k].state_offset, s[k].n);
    if (lo < hi) f(s[k], lo, hi);
  }
}

}  // namespace

void sgd_step(const Chunk& c, const SgdHyper& h) {
  // d = g + wd * p; buf = first ? d : buf * mu + (1 - dampening) * d;
  // d = nesterov ? d + mu * buf : buf; p = p + (-lr) * d
  const float wd = static_cast<float>(h.weight_decay), mu = static_cast<float>(h.momentum);
  const float damp = static_cast<float>(1 - h.dampening), neg_lr = static_cast<float>(-1 * h.lr);
  const bool use_wd = h.weight_decay != 0, use_mom = h.momentum != 0;
  at::parallel_for(0, c.total, kGrain, [&](int64_t b, int64_t e) {
    for_range(c, b, e, [&](const Segment& s, int64_t lo, int64_t hi) {
      float* __restrict p = s.param;
      const float* __restrict g = s.grad;
      float* __restrict buf = c.state0 ? c.state0 + s.state_offset : nullptr;
      for (int64_t i = lo; i < hi; ++i) {
        float d = use_wd ? g[i] + wd * p[i] : g[i];
        if (use_mom) {
          float m = h.first ? d : buf[i] * mu + damp * d;
          buf[i] = m;
          d = h.nesterov ? d + mu * m : m;
        }
        p[i] = p[i] + neg_lr * d;
      }
    });
  });
}

void adam_step(const Chunk& c, const AdamHyper& h) {
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.step));
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float c1 = static_cast<float>(1 - h.beta1), c2 = static_cast<float>(1 - h.beta2);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2)), eps = static_cast<float>(h.eps);
  const float neg_step = static_cast<float>(-(h.lr / bc1));
  const float wd = static_cast<float>(h.weight_decay);
  const float decay = static_cast<float>(1 - h.lr * h.weight_decay);
  const bool coupled_wd = !h.decoupled && h.weight_decay != 0;
  const bool decoupled_wd = h.decoupled && h.weight_decay != 0;
  const bool ams = h.amsgrad;
  at::parallel_for(0, c.total, kGrain, [&](int64_t b, int64_t e) {
    for_range(c, b, e, [&](const Segment& s, int64_t lo, int64_t hi) {
      float* __restrict p = s.param;
      const float* __restrict g = s.grad;
      float* __restrict m = c.state0 + s.state_offset;
      float* __restrict v = c.state1 + s.state_offset;
      float* __restrict vmax = ams ? c.state2 + s.state_offset : nullptr;
      for (int64_t i = lo; i < hi; ++i) {
        float pi = p[i];
        if (decoupled_wd) pi = pi * decay;
        const float gi = coupled_wd ? g[i] + wd * pi : g[i];
        const float mi = m[i] * b1 + c1 * gi;
        float vi = v[i] * b2 + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        if (ams) {
          vi = std::max(vmax[i], vi);
          vmax[i] = vi;
        }
        const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
        p[i] = pi + neg_step * mi / denom;
      }
    });
  });
}

}  // namespace distopt::plugins::fused
