// Single-pass update kernels of the `fused` algorithm: libtorch's SGD, Adam
// and AdamW update rules (torch/csrc/api/src/optim/{sgd,adam,adamw}.cpp,
// libtorch 1.13), written as one loop that reads each element's parameter,
// gradient and state once and writes them once. libtorch runs 6-10 separate
// tensor ops per parameter (each a full pass over memory, plus temporaries);
// here the whole group is one pass, so the step is bound by memory
// bandwidth: Adam moves 28 bytes per fp32 element (read p, g, m, v; write
// p, m, v).
//
// Every kernel evaluates in fp32 in the same order as libtorch's CPU
// kernels (scalars rounded to float first, as TensorIterator does), so the
// result equals the unfused optimizer up to float rounding of reordered
// vector code (<1e-6 after tens of steps; tests/fused checks it).
//
// A Chunk is a set of Segments updated by one parallel loop: segment k
// updates n elements of the parameter at `param` with the gradient at
// `grad` and the state at offset `state_offset` of the chunk's state
// buffers. Segments are sorted by state_offset and lie in [0, total),
// possibly with gaps between them (alignment padding, left untouched).
// Thread safety: one call per chunk at a time; uses at::parallel_for.
#pragma once

#include <cstdint>
#include <vector>

namespace distopt::plugins::fused {

struct Segment {
  float* param;
  const float* grad;
  int64_t n;
  int64_t state_offset;  // into the chunk's state buffers
};

struct Chunk {
  std::vector<Segment> segments;  // sorted by state_offset
  int64_t total = 0;              // elements: the end of the last segment
  float* state0 = nullptr;        // momentum buffer (SGD) or exp_avg (Adam)
  float* state1 = nullptr;        // exp_avg_sq (Adam)
  float* state2 = nullptr;        // max_exp_avg_sq (Adam with amsgrad)
};

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // first step: the momentum buffer is initialised to the gradient
};

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
  bool decoupled;  // AdamW: p *= 1 - lr * wd instead of g += wd * p
  int64_t step;    // 1 on the first step
};

void sgd_step(const Chunk& c, const SgdHyper& h);
void adam_step(const Chunk& c, const AdamHyper& h);

}  // namespace distopt::plugins::fused
