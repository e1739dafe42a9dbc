// buffers.sync on real ranks: a BatchNorm model whose ranks see different
// data, so their running statistics differ unless synchronised.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::test::fork_ranks;
using distopt::test::max_abs_diff;
using distopt::test::plugins_and_world_yaml;
using distopt::test::random_port;
using distopt::test::rank_runtime;
using distopt::test::read_doubles;
using distopt::test::write_doubles;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::relu(bn->forward(fc1->forward(x))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

// running_mean, running_var, num_batches_tracked, as doubles.
std::vector<double> buffers_of(Net& net) {
  std::vector<double> out;
  for (const auto& b : net->named_buffers()) {
    auto d = b.value().to(torch::kDouble).reshape({-1});
    out.insert(out.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
  return out;
}

struct Run {
  std::vector<std::vector<double>> before, after;  // per rank: last step, before / after step()
  std::vector<double> consolidated;                // rank 0's consolidate() of the buffers
};

constexpr int kSteps = 5;

Run train(const std::string& mode, int world, const std::string& dir) {
  std::string yaml = plugins_and_world_yaml(world, random_port()) +
                     "communicator: {name: tcp}\noptimizer: {name: sgd, lr: 0.1}\n";
  if (!mode.empty()) yaml += "buffers: {sync: " + mode + "}\n";
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(1);
        Net net;
        auto rt = rank_runtime(yaml, rank, world);
        auto opt = rt.make_optimizer(*net);
        // Each rank its own data, shifted by rank: different statistics.
        distopt::test::seed_cpu(100 + rank);
        for (int s = 0; s < kSteps; ++s) {
          auto x = torch::randn({16, 8}) + rank;
          auto y = torch::randint(0, 2, {16});
          opt.zero_grad();
          torch::nn::functional::cross_entropy(net->forward(x), y).backward();
          if (s == kSteps - 1)
            write_doubles(dir + "/before" + std::to_string(rank), buffers_of(net));
          opt.step();
        }
        write_doubles(dir + "/after" + std::to_string(rank), buffers_of(net));
        auto all = rt.consolidate(*net, opt, 0);
        if (rank == 0) {
          std::vector<double> c;
          for (const char* n : {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}) {
            auto d = all.at(std::string("model/") + n).to(torch::kDouble).reshape({-1});
            const double* p = d.data_ptr<double>();
            c.insert(c.end(), p, p + d.numel());
          }
          write_doubles(dir + "/consolidated", c);
        }
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  Run r;
  for (int k = 0; k < world; ++k) {
    CAPTURE(k);
    REQUIRE(codes[k] == 0);
    r.before.push_back(read_doubles(dir + "/before" + std::to_string(k)));
    r.after.push_back(read_doubles(dir + "/after" + std::to_string(k)));
  }
  r.consolidated = read_doubles(dir + "/consolidated");
  return r;
}

}  // namespace

TEST_CASE("buffers.sync: identical BatchNorm statistics on every rank after every step") {
  const std::string dir = distopt::test::make_temp_dir("distopt_buffers");
  for (int world : {2, 3}) {
    CAPTURE(world);
    SUBCASE("broadcast (the default): every rank holds rank 0's own statistics") {
      Run r = train("", world, dir);
      CHECK(r.after[0] == r.before[0]);  // rank 0 is the root: untouched
      for (int k = 1; k < world; ++k) {
        CHECK(r.after[k] == r.after[0]);
        CHECK(max_abs_diff(r.before[k], r.before[0]) > 0.01);  // one forward apart
      }
      CHECK(r.consolidated == r.after[0]);
    }
    SUBCASE("average: floating buffers are the mean, num_batches_tracked rank 0's") {
      Run r = train("average", world, dir);
      const size_t n = r.after[0].size();  // 16 mean + 16 var + 1 count
      REQUIRE(n == 33);
      for (int k = 1; k < world; ++k) CHECK(r.after[k] == r.after[0]);
      for (size_t i = 0; i + 1 < n; ++i) {
        double mean = 0;
        for (int k = 0; k < world; ++k) mean += r.before[k][i] / world;
        CHECK(std::abs(r.after[0][i] - mean) <= 1e-6);
      }
      CHECK(r.after[0][n - 1] == kSteps);
      CHECK(r.consolidated == r.after[0]);
    }
    SUBCASE("none: each rank keeps its own") {
      Run r = train("none", world, dir);
      for (int k = 0; k < world; ++k) CHECK(r.after[k] == r.before[k]);
      CHECK(max_abs_diff(r.after[1], r.after[0]) > 0.1);
    }
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("buffers.sync: a bad mode is refused naming the key") {
  try {
    distopt::parse_job_config("buffers: {sync: mean}\n", "job.yaml");
    FAIL("accepted buffers.sync: mean");
  } catch (const distopt::ConfigError& e) {
    const std::string m = e.what();
    CHECK(m.find("job.yaml:1") != std::string::npos);
    CHECK(m.find("buffers.sync") != std::string::npos);
    CHECK(m.find("broadcast") != std::string::npos);
  }
  auto cfg = distopt::parse_job_config("buffers: {sync: average}\n", "job.yaml");
  CHECK(cfg.buffer_sync == distopt::BufferSync::average);
  CHECK(distopt::parse_job_config("", "job.yaml").buffer_sync == distopt::BufferSync::broadcast);
}
