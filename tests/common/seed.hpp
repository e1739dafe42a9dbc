// Seeding for tests that fork ranks (multiproc.hpp).
#pragma once

#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <mutex>

namespace distopt::test {

/// Seed libtorch's CPU generator only. torch::manual_seed also seeds every
/// CUDA generator, which initialises CUDA where a GPU is present; a process
/// that did so and then forks leaves children in which every CUDA call,
/// torch::manual_seed's included, fails ("CUDA error: initialization error",
/// seen on the GPU machine). The tests' tensors are on the CPU.
inline void seed_cpu(uint64_t seed) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace distopt::test
