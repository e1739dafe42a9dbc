// Checkpoints of `hierarchical` with an inner reducer (powersgd between the
// node leaders, 2 nodes x 2 ranks set per forked rank with DISTOPT_NODE_ID):
// the leaders forward the inner's state (error-feedback residuals, Q's,
// step counts), so a resumed run continues bitwise; another node layout of
// the same world size is refused, naming both layouts.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "rank_steps.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kWorld = 4, kIn = 20, kClasses = 10;

std::string job_yaml() {
  std::ostringstream y;
  y << plugins_and_world_yaml(kWorld, random_port()) << "communicator: {name: tcp}\n"
    << "reducer: {name: hierarchical, options: {variant: leader}, inner: {name: powersgd, "
       "options: {rank: 2, start_iter: 0}}}\n"
    << "algorithm: {name: allreduce}\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";
  return y.str();
}

// Ranks on `nodes` (DISTOPT_NODE_ID per rank) train `before` steps and save,
// then train `after` more; or load and train `after` steps. Each writes its
// parameters after loading / saving and at the end. Returns the exit codes;
// a rank whose load throws writes the message to <what>_error<rank>.
std::vector<int> run(const std::string& dir, const std::string& ckpt,
                     const std::vector<std::string>& nodes, bool load, int before, int after,
                     const std::string& tag) {
  const std::string job = job_yaml();
  return fork_ranks(kWorld, [&](int rank) {
    setenv("DISTOPT_NODE_ID", nodes[rank].c_str(), 1);
    torch::set_num_threads(1);
    distopt::test::seed_cpu(7);
    Mlp3 net(kIn, kClasses);
    auto rt = rank_runtime(job, rank, kWorld, "ckpt.yaml");
    auto opt = rt.make_optimizer(*net);
    auto step = [&](int t) { random_batch_step(net, opt, rank, t); };
    if (load) {
      try {
        rt.load_checkpoint(ckpt, *net, opt);
      } catch (const std::exception& e) {
        std::ofstream(rank_file(dir, tag + "_error", rank)) << e.what();
        return 3;
      }
      write_doubles(rank_file(dir, tag + "_loaded", rank), flat_params(net));
    } else {
      for (int t = 0; t < before; ++t) step(t);
      write_doubles(rank_file(dir, tag + "_saved", rank), flat_params(net));
      rt.save_checkpoint(ckpt, *net, opt);
    }
    for (int t = before; t < before + after; ++t) step(t);
    write_doubles(rank_file(dir, tag, rank), flat_params(net));
    return 0;
  });
}

}  // namespace

TEST_CASE("hierarchical + inner powersgd: a resume continues bitwise; another layout is refused") {
  TempDir dir("distopt_hier_ckpt");
  const std::string ckpt = dir / "ckpt";
  const std::vector<std::string> nodes = {"a", "a", "b", "b"};
  for (int c : run(dir.path, ckpt, nodes, false, 5, 4, "straight")) REQUIRE(c == 0);
  // The inner's state is in the leaders' shards (ranks 0 and 2), the node layout in rank 0's.
  for (const std::string& name : list_dir(ckpt)) {
    const std::string step = ckpt + "/" + name;
    if (!is_dir(step)) continue;
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      const std::string shard = read_text(step + "/rank-0000" + std::to_string(r) + "-of-00004.pt");
      REQUIRE_FALSE(shard.empty());
      CHECK((shard.find("reducer/error_feedback/fc1.weight") != std::string::npos) == (r % 2 == 0));
      CHECK((shard.find("reducer/hierarchical/node_of_rank") != std::string::npos) == (r == 0));
    }
  }
  for (int c : run(dir.path, ckpt, nodes, true, 5, 4, "resumed")) REQUIRE(c == 0);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const auto loaded = read_doubles(rank_file(dir.path, "resumed_loaded", r));
    CHECK(max_abs_diff(loaded, read_doubles(rank_file(dir.path, "straight_saved", r))) == 0);
    CHECK(max_abs_diff(read_doubles(rank_file(dir.path, "resumed", r)),
                       read_doubles(rank_file(dir.path, "straight", r))) == 0);
  }
  // The same world size on nodes a,b,a,b: leader ranks 0 and 1 now, 0 and 2
  // when saved. The inner's per-leader state would land on other ranks.
  const auto codes = run(dir.path, ckpt, {"a", "b", "a", "b"}, true, 5, 1, "moved");
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 3);
    const std::string err = read_text(rank_file(dir.path, "moved_error", r));
    CHECK(err.find("saved with the ranks on nodes [0, 0, 1, 1], this job has them on [0, 1, 0, "
                   "1]") != std::string::npos);
  }
}
