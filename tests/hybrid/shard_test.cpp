// `hybrid` with shard: true (ZeRO stage 1 over the host and device parts)
// on 2, 3 and 4 real ranks:
// - equal to one libtorch process on the averaged gradient to 1e-6 for
//   offload_fraction 0, 0.5, 1, SGD (momentum) and Adam, two parameter
//   groups and a set_lr halfway; every rank equal;
// - optimizer state per rank: the ranks' bytes add up to the unsharded
//   state exactly, and each rank holds at most ceil(total / W) elements' worth;
// - gradients from another reducer (topk with error feedback): equal to
//   `allreduce` with the same reducer.
// Checkpoints with shard: true are in checkpoint_test.cpp.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "hybrid_helpers.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kSteps = 10;
constexpr int64_t kNumel = 1370;  // Mlp3's trainable elements (hybrid_helpers.hpp)
const double kFractions[] = {0, 0.5, 1};

std::string sharded(double fraction) {
  return "{name: hybrid, options: {shard: true, offload_fraction: " + std::to_string(fraction) +
         "}}";
}

void check_world(const std::string& optimizer, int world) {
  CAPTURE(optimizer);
  CAPTURE(world);
  const std::string dir = make_temp_dir("distopt_hybrid_shard");
  auto ref = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    write_doubles(dir + "/ref.bin", reference_run(optimizer, std::vector<int>(kSteps, world)));
    return 0;
  });
  REQUIRE(ref[0] == 0);
  const auto reference = read_doubles(dir + "/ref.bin");
  std::vector<std::string> jobs;
  for (double f : kFractions)
    jobs.push_back(hybrid_job(world, random_port(), sharded(f), optimizer));
  const auto outcomes = run_jobs(jobs, world, kSteps, dir);
  // fp32 state per element: SGD's momentum, Adam's two moments.
  const double per_elem = optimizer == "sgd" ? 4 : 8;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Outcome& o = outcomes[j];
    CAPTURE(kFractions[j]);
    check_ranks_equal_reference(o.params, reference);
    INFO("state bytes per rank: " << o.state_bytes[0] << " ... " << o.state_bytes[world - 1]);
    CHECK(std::accumulate(o.state_bytes.begin(), o.state_bytes.end(), 0.0) == per_elem * kNumel);
    const double chunk = static_cast<double>((kNumel + world - 1) / world);
    CHECK(*std::max_element(o.state_bytes.begin(), o.state_bytes.end()) <= per_elem * chunk);
  }
  distopt::test::remove_tree(dir);
}

}  // namespace

TEST_CASE("hybrid shard: SGD(momentum) equals libtorch, state 1/W per rank, 2-4 ranks") {
  for (int world : {2, 3, 4}) check_world("sgd", world);
}

TEST_CASE("hybrid shard: Adam equals libtorch, state 1/W per rank, 2-4 ranks") {
  for (int world : {2, 3, 4}) check_world("adam", world);
}

TEST_CASE("hybrid shard takes another reducer's gradients: equal to allreduce with topk") {
  const int world = 3;
  const std::string dir = make_temp_dir("distopt_hybrid_shard_topk");
  auto job = [&](const std::string& algorithm) {
    std::ostringstream y;
    y << plugins_and_world_yaml(world, random_port()) << "communicator: {name: tcp}\n"
      << "reducer: {name: topk, options: {ratio: 0.1, min_k: 8, error_feedback: true, "
         "bucket_cap_mb: 0.002}}\n"
      << "algorithm: " << algorithm << "\noptimizer: " << optimizer_yaml("adam") << "\n";
    return y.str();
  };
  const auto o = run_jobs({job("{name: allreduce}"), job(sharded(0.5))}, world, kSteps, dir);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(o[1].params[r], o[0].params[r]) <= 1e-6);
  }
  // topk changed the gradients: far from the exact mean's result.
  auto ref = fork_ranks(1, [&](int) {
    write_doubles(dir + "/ref.bin", reference_run("adam", std::vector<int>(kSteps, world)));
    return 0;
  });
  REQUIRE(ref[0] == 0);
  CHECK(max_abs_diff(o[1].params[0], read_doubles(dir + "/ref.bin")) > 1e-3);
  distopt::test::remove_tree(dir);
}
