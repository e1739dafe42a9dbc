// After load_checkpoint the byte counters count this process's steps only
// (a resumed run reported the plain-allreduce bytes of every step
// since step 0 next to bytes_sent of this run, so ZeRO looked cheaper).
#include <torch/utils.h>

#include <string>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "rank_steps.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

using namespace distopt::test;

TEST_CASE("bytes_sent and bytes_sent_plain_allreduce after a resume count the new steps only") {
  const int world = 2;
  TempDir dir("distopt_counters");
  const std::string job = plugins_and_world_yaml(world, random_port()) +
                          "algorithm: {name: zero}\noptimizer: {name: sgd, lr: 0.05}\n";
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        Mlp3 net;
        auto rt = rank_runtime(job, rank, world, "counters.yaml");
        auto opt = rt.make_optimizer(*net);
        for (int s = 0; s < 3; ++s) random_batch_step(net, opt, rank, s);
        const uint64_t plain3 = opt.bytes_sent_plain_allreduce(), sent3 = opt.bytes_sent();
        if (plain3 == 0 || sent3 == 0 || plain3 % 3 != 0) return 2;
        rt.save_checkpoint(dir.path + "/ck", *net, opt);
        Mlp3 net2;
        auto opt2 = rt.make_optimizer(*net2);
        rt.load_checkpoint(dir.path + "/ck", *net2, opt2);
        if (opt2.steps() != 3) return 3;
        if (opt2.bytes_sent() != 0 || opt2.bytes_sent_plain_allreduce() != 0) return 4;
        random_batch_step(net2, opt2, rank, 3);
        if (opt2.bytes_sent_plain_allreduce() != plain3 / 3) return 5;
        if (opt2.bytes_sent() != sent3 / 3) return 6;
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < world; ++r) CHECK_MESSAGE(codes[r] == 0, "rank " << r);
}
