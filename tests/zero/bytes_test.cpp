// What the `zero` algorithm reports as sent ("algorithm.bytes_sent"), per
// rank and step, on 2 and 3 real ranks: the ring / chain formulas of
// zero_algorithm.hpp, and, with the tcp communicator's shared-memory path
// off, exactly what tcp counts on its sockets ("comm.bytes_sent") minus the
// reducer's allreduce ("reducer.bytes_sent"), where the reducer's ring model
// is exact (even blocks).
#include <torch/nn/modules/linear.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/host_api.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::test::fork_ranks;
using distopt::test::random_port;
using distopt::test::rank_runtime;

constexpr int kIn = 20, kClasses = 10, kBatch = 8, kSteps = 3;

// 1370 trainable fp32 elements, one bucket (default 25 MB cap) with no
// alignment padding (every size is even, align_bytes 8):
//   fc1.weight 640, fc1.bias 32, fc2.weight 512, fc2.bias 16, fc3.weight 160, fc3.bias 10
using Net = distopt::test::Mlp3;  // kIn (20) -> 32 -> 16 -> kClasses (10)

struct Sent {
  double algorithm = 0, reducer = 0, comm = 0, optimizer = 0;
};

// Per rank: the metrics counted during kSteps steps (after the optimizer's
// initial parameter broadcast).
std::vector<Sent> run(int world, const std::string& zero_options) {
  const std::string dir = distopt::test::make_temp_dir("distopt_zero_bytes");
  std::ostringstream yaml;
  yaml << distopt::test::plugins_and_world_yaml(world, random_port())
       << "communicator: {name: tcp, options: {shm: false}}\n"  // count socket bytes
       << "reducer: {name: mean}\n"
       << "algorithm: {name: zero, options: " << zero_options << "}\n"
       << "optimizer: {name: adam, lr: 0.01}\n";  // join off (default): no per-step count
  const std::string job = yaml.str();
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(1234 + rank);
        auto x = at::randn({kBatch, kIn});
        auto y = at::randint(0, kClasses, {kBatch});
        Net net;
        auto rt = rank_runtime(job, rank, world, "zero.yaml");
        auto opt = rt.make_optimizer(*net);
        distopt::metrics_reset();  // forget the initial broadcast
        for (int step = 0; step < kSteps; ++step) {
          opt.zero_grad();
          at::nll_loss(at::log_softmax(net->forward(x), 1), y).backward();
          opt.step();
        }
        auto m = distopt::metrics_snapshot();
        std::ofstream(dir + "/rank" + std::to_string(rank))
            << m["algorithm.bytes_sent"] << " " << m["reducer.bytes_sent"] << " "
            << m["comm.bytes_sent"] << " " << opt.bytes_sent() << "\n";
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  std::vector<Sent> out;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    Sent s;
    std::ifstream f(dir + "/rank" + std::to_string(r));
    f >> s.algorithm >> s.reducer >> s.comm >> s.optimizer;
    REQUIRE(static_cast<bool>(f));
    // What `distopt train` reports: the reducer's and the algorithm's own (ABI 1.1).
    CHECK(s.optimizer == s.reducer + s.algorithm);
    out.push_back(s);
  }
  distopt::test::remove_tree(dir);
  return out;
}

}  // namespace

TEST_CASE("zero stage 1, greedy, broadcast: each rank sends the parameters it owns (2 ranks)") {
  // Greedy over sizes 640, 512, 160, 32, 16, 10: rank 0 owns 640 + 32 + 16 =
  // 688 elements, rank 1 512 + 160 + 10 = 682. With 2 ranks a chain broadcast
  // is sent by its root only.
  auto s = run(2, "{stage: 1, partition: greedy}");
  const double algorithm[] = {688 * 4, 682 * 4};
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(s[r].algorithm == kSteps * algorithm[r]);
    CHECK(s[r].reducer == kSteps * 1370 * 4);  // ring allreduce: 2 (W-1)/W x 5480 bytes
    CHECK(s[r].comm == s[r].reducer + s[r].algorithm);
  }
}

TEST_CASE("zero stage 1, contiguous, allgather: (W-1) x chunk (2 ranks)") {
  auto s = run(2, "{stage: 1, partition: contiguous, parameters_as_bucket_view: true}");
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(s[r].algorithm == kSteps * 685 * 4);
    CHECK(s[r].comm == s[r].reducer + s[r].algorithm);
  }
}

TEST_CASE("zero stage 2: reduce-scatter plus parameter sync, nothing through the reducer") {
  SUBCASE("2 ranks, allgather") {
    // chunk 685: reduce-scatter 685 x 4, allgather 685 x 4
    auto s = run(2, "{stage: 2, partition: contiguous, parameters_as_bucket_view: true}");
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(s[r].reducer == 0);
      CHECK(s[r].algorithm == kSteps * 2 * 685 * 4);
      CHECK(s[r].comm == s[r].algorithm);
    }
  }
  SUBCASE("3 ranks, broadcast per slice") {
    // chunk ceil(1370 / 3) = 457 (padded to 1371): reduce-scatter 2 x 457 x 4
    // per rank. Slices owned: 457, 457, 456 elements, each below the p2p
    // broadcast's small_bytes: its root sends it to both other ranks.
    auto s = run(3, "{stage: 2, partition: contiguous}");
    const double bcast[] = {2 * 457 * 4, 2 * 457 * 4, 2 * 456 * 4};
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(s[r].reducer == 0);
      CHECK(s[r].algorithm == kSteps * (2 * 457 * 4 + bcast[r]));
      CHECK(s[r].comm == s[r].algorithm);
    }
  }
}
