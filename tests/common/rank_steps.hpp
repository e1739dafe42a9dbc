// One training step of an Mlp3 on a batch only this rank and step draw: the
// data differ per rank (so local replicas drift apart) and are the same in
// every run (so a resumed run can be compared bitwise with an uninterrupted
// one). Include before torch_doctest.hpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "distopt/distributed_optimizer.hpp"
#include "seed.hpp"
#include "test_net.hpp"

namespace distopt::test {

/// zero_grad, forward/backward of NLL on `batch` random samples seeded by
/// 10000 * (rank + 1) + step, then step().
inline void random_batch_step(Mlp3& net, distopt::DistributedOptimizer& opt, int rank, int step,
                              int64_t batch = 8) {
  distopt::test::seed_cpu(10000 * (rank + 1) + step);
  opt.zero_grad();
  const int64_t in = net->fc1->options.in_features();
  const int64_t classes = net->fc3->options.out_features();
  at::nll_loss(at::log_softmax(net->forward(at::randn({batch, in})), 1),
               at::randint(0, classes, {batch}))
      .backward();
  opt.step();
}

}  // namespace distopt::test
