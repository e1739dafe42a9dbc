// Elastic training in an embedding program (distopt::Elastic): 3 ranks under
// `distopt launch --elastic`, one killed; the survivors end where a plain
// single-process libtorch run on the same global batches ends (float
// tolerance), for allreduce and zero. The API refuses a job without
// elastic.enabled.
#include <torch/torch.h>

#include <fstream>

#include "distopt/config.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/elastic.hpp"
#include "distopt/runtime.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"
// after doctest:
#include "cli_util.hpp"
#include "multiproc.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using namespace distopt::test::cli;

namespace {

constexpr int64_t kGlobal = 6, kSteps = 12;

std::pair<torch::Tensor, torch::Tensor> batch(int64_t step) {  // as embed_rank.cpp
  auto i = torch::arange(kGlobal * 4, torch::kFloat);
  auto x = torch::sin(i * static_cast<double>(step + 1) * 0.37).view({kGlobal, 4});
  auto y =
      torch::cos(torch::arange(kGlobal * 3, torch::kFloat) * static_cast<double>(step + 2) * 0.21)
          .view({kGlobal, 3});
  return {x, y};
}

// The reference: one process, the whole global batch each step.
std::vector<double> reference(int64_t steps = kSteps) {
  distopt::test::seed_cpu(0);
  torch::nn::Linear model(4, 3);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
  std::vector<double> out;
  for (const auto& p : model->parameters()) {
    auto flat = p.detach().reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(flat[i].item<double>());
  }
  return out;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string job(const TempDir& t, const std::string& algorithm,
                const std::string& elastic = "{enabled: true, min_ranks: 2}") {
  std::ofstream f(t.file("job.yaml"));
  f << "world: {size: 3, timeout_s: 30}\n"
    << "communicator: {name: tcp}\nreducer: {name: mean}\n"
    << "algorithm: " << algorithm << "\n"
    << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
    << "elastic: " << elastic << "\n";  // max_ranks 0: 3, the starting world
  return t.file("job.yaml");
}

void killed_equals_reference(const std::string& algorithm) {
  TempDir t;
  const std::string cfg = job(t, algorithm);
  const std::string out = t.file("params.txt");
  ProcResult r = run_command({cli(), "launch", "--elastic", "-n", "3", "--config", cfg, "--",
                              DISTOPT_EMBED_RANK, out, std::to_string(kSteps), "1", "6"},
                             {}, std::chrono::seconds(180));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("rank 1 exits before step 6") != std::string::npos);
  CHECK(r.output.find("rank 2 is rank 1 of 2 in generation 1, back at step 5") !=
        std::string::npos);
  CHECK(r.output.find("rank 0 done at step 12 as rank 0 of 2") != std::string::npos);
  std::ifstream f(out + ".0");
  std::vector<double> got;
  for (double v; f >> v;) got.push_back(v);
  CHECK(slurp(out + ".1") == slurp(out + ".0"));  // the other survivor: bitwise the same
  const std::vector<double> want = reference();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("parameter element " << i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("embedding, zero: a killed rank restarted by the launcher rejoins and ends equal") {
  TempDir t;
  const std::string cfg = job(t, "{name: zero, options: {stage: 1}}");
  const std::string out = t.file("params.txt");
  ProcResult r =
      run_command({cli(), "launch", "--elastic", "--max-restarts", "1", "-n", "3", "--config", cfg,
                   "--", DISTOPT_EMBED_RANK, out, std::to_string(kSteps), "1", "6", "8"},
                  {}, std::chrono::seconds(180));
  INFO(r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("restarting rank 1 (DISTOPT_RESTART_COUNT=1") != std::string::npos);
  CHECK(r.output.find("rank 1 rejoined as rank 2 of 3 at step ") != std::string::npos);
  CHECK(r.output.find("rank 1 done at step 12 as rank 2 of 3") != std::string::npos);
  // Every rank, the rejoined one included, ends with the same parameters,
  // and they are the single process's.
  const std::string p0 = slurp(out + ".0");
  REQUIRE_FALSE(p0.empty());
  CHECK(slurp(out + ".1") == p0);
  CHECK(slurp(out + ".2") == p0);
  std::ifstream f(out + ".0");
  std::vector<double> got;
  for (double v; f >> v;) got.push_back(v);
  const std::vector<double> want = reference();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("parameter element " << i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("embedding: a new process (launch --elastic --join) joins 3 running ranks as the 4th") {
  TempDir t;
  const std::string cfg =
      job(t, "{name: zero, options: {stage: 2}}", "{enabled: true, min_ranks: 2, max_ranks: 4}");
  const std::string out = t.file("params.txt");
  const int port = distopt::test::random_port();
  const std::string token = "elastic-join-test-" + std::to_string(port);
  Background running({cli(), "launch", "--elastic", "-n", "3", "--master-port",
                      std::to_string(port), "--rdzv-id", token, "--config", cfg, "--",
                      DISTOPT_EMBED_RANK, out, std::to_string(kSteps), "-1", "-1", "3"});
  // The joining process may ask at any time, even before the running ranks'
  // rendezvous: it is taken in at their next commit after it asked.
  ProcResult joined =
      run_command({cli(), "launch", "--elastic", "--join", "-n", "1", "--master-port",
                   std::to_string(port), "--rdzv-id", token, "--config", cfg, "--",
                   DISTOPT_EMBED_RANK, out, std::to_string(kSteps), "-1", "-1", "3"},
                  {}, std::chrono::seconds(180));
  INFO(joined.output);
  const int code = running.wait(std::chrono::seconds(180));
  INFO(running.output);
  REQUIRE(joined.exit_code == 0);
  REQUIRE(code == 0);
  CHECK(joined.output.find("rejoined as rank 3 of 4 at step ") != std::string::npos);
  CHECK(running.output.find("taking in 1 rank(s) at optimizer step") != std::string::npos);
  const std::string p0 = slurp(out + ".0");
  REQUIRE_FALSE(p0.empty());
  for (int r = 1; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(slurp(out + "." + std::to_string(r)) == p0);  // the new rank too: bitwise
  }
  std::ifstream f(out + ".0");
  std::vector<double> got;
  for (double v; f >> v;) got.push_back(v);
  const std::vector<double> want = reference();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("parameter element " << i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("embedding: launch --elastic --nnodes 2:3: two nodes start, a third arrives and joins") {
  // Three node launchers on loopback, one rank each. max_ranks 0: the
  // launcher's MAX x K = 3 bounds the world (else the starting 2 would).
  TempDir t;
  const std::string cfg = job(t, "{name: allreduce}", "{enabled: true, min_ranks: 2}");
  const std::string out = t.file("params.txt");
  const int port = distopt::test::random_port();
  const std::string token = "elastic-nodes-" + std::to_string(port);
  const std::vector<std::string> node = {cli(),
                                         "launch",
                                         "--elastic",
                                         "--nnodes",
                                         "2:3",
                                         "-n",
                                         "1",
                                         "--rdzv-settle",
                                         "1",
                                         "--master-port",
                                         std::to_string(port),
                                         "--rdzv-id",
                                         token,
                                         "--config",
                                         cfg,
                                         "--",
                                         DISTOPT_EMBED_RANK,
                                         out,
                                         std::to_string(kSteps),
                                         "-1",
                                         "-1",
                                         "3"};
  Background a(node), b(node);
  // The job has started once a launcher knows its node of 2; its ranks then
  // wait before step 3 until a process asks to join.
  const auto started = [](const std::string& o) {
    return o.find(" of 2: ranks ") != std::string::npos;
  };
  REQUIRE(a.read_until(started, std::chrono::seconds(100)));
  ProcResult c = run_command(node, {}, std::chrono::seconds(150));
  INFO(c.output);
  const int code_a = a.wait(std::chrono::seconds(150)), code_b = b.wait(std::chrono::seconds(30));
  INFO(a.output);
  INFO(b.output);
  REQUIRE_FALSE(c.timed_out);
  CHECK(c.output.find("the job started with 2 node(s) before this one arrived") !=
        std::string::npos);
  CHECK(c.output.find("rejoined as rank 2 of 3 at step ") != std::string::npos);
  CHECK(c.exit_code == 0);
  CHECK(code_a == 0);
  CHECK(code_b == 0);
  // Node ranks in arrival order: one launcher is node 0, the other node 1.
  CHECK((a.output + b.output).find("node 0 of 2: ranks 0..0 of 2") != std::string::npos);
  CHECK((a.output + b.output).find("node 1 of 2: ranks 1..1 of 2") != std::string::npos);
  CHECK((a.output + b.output).find("taking in 1 rank(s) at optimizer step") != std::string::npos);
  const std::string p0 = slurp(out + ".0");
  REQUIRE_FALSE(p0.empty());
  CHECK(slurp(out + ".1") == p0);
  CHECK(slurp(out + ".2") == p0);  // the joined node's rank: bitwise the same
  std::ifstream f(out + ".0");
  std::vector<double> got;
  for (double v; f >> v;) got.push_back(v);
  const std::vector<double> want = reference();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("parameter element " << i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("embedding: a joined process that dies is recorded dead; the others recover at once") {
  // world.timeout_s 120: an agreement that waited for the dead process
  // instead of its launcher's record would outlast the hang guards (100 s).
  TempDir t;
  std::string cfg;
  {
    std::ofstream f(t.file("job.yaml"));
    f << "world: {size: 3, timeout_s: 120}\n"
      << "communicator: {name: tcp}\nreducer: {name: mean}\nalgorithm: {name: allreduce}\n"
      << "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n"
      << "elastic: {enabled: true, min_ranks: 2, max_ranks: 4}\n";
    cfg = t.file("job.yaml");
  }
  const std::string out = t.file("params.txt");
  const int port = distopt::test::random_port();
  const std::string token = "elastic-join-dies-" + std::to_string(port);
  Background running({cli(), "launch", "--elastic", "-n", "3", "--master-port",
                      std::to_string(port), "--rdzv-id", token, "--config", cfg, "--",
                      DISTOPT_EMBED_RANK, out, std::to_string(kSteps), "-1", "-1", "3"});
  ProcResult joined =
      run_command({cli(), "launch", "--elastic", "--join", "-n", "1", "--master-port",
                   std::to_string(port), "--rdzv-id", token, "--config", cfg, "--",
                   DISTOPT_EMBED_RANK, out, std::to_string(kSteps), "-1", "-1", "3"},
                  {"EMBED_EXIT_AFTER_JOIN=2"}, std::chrono::seconds(100));
  INFO(joined.output);
  const int code = running.wait(std::chrono::seconds(100));
  INFO(running.output);
  REQUIRE_FALSE(joined.timed_out);
  CHECK(joined.output.find("rejoined as rank 3 of 4 at step ") != std::string::npos);
  CHECK(joined.output.find("joined rank exits at step ") != std::string::npos);
  CHECK(joined.exit_code == 1);  // its launcher: its only rank failed
  REQUIRE(code == 0);
  // The survivors' agreement closed on the launcher's record of the death
  // (elastic/dead/<the joined process's member id>), not at world.timeout_s.
  // (The first joining process's member id: 2000000000 + 1, see
  // core/src/runtime/membership.hpp.)
  CHECK(running.output.find("member(s) arrived, recorded dead: 2000000001; the others were "
                            "recorded dead by the launcher") != std::string::npos);
  CHECK(running.output.find("world.timeout_s passed") == std::string::npos);
  CHECK(running.output.find("rank 0 done at step 12 as rank 0 of 3") != std::string::npos);
  const std::string p0 = slurp(out + ".0");
  REQUIRE_FALSE(p0.empty());
  CHECK(slurp(out + ".1") == p0);
  CHECK(slurp(out + ".2") == p0);
  std::ifstream f(out + ".0");
  std::vector<double> got;
  for (double v; f >> v;) got.push_back(v);
  const std::vector<double> want = reference();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("parameter element " << i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  }
}

TEST_CASE("embedding, allreduce: a rank killed at step 6 of 12; the 2 left end as one process") {
  killed_equals_reference("{name: allreduce}");
}

TEST_CASE("embedding, zero: the killed rank's shard is rebuilt from its buddy") {
  killed_equals_reference("{name: zero, options: {stage: 2}}");
}

TEST_CASE("distopt::Elastic refuses a job without elastic.enabled, naming the key") {
  TempDir t;
  {
    std::ofstream f(t.file("plain.yaml"));
    f << "world: {size: 1}\noptimizer: {name: sgd, lr: 0.1}\n";
  }
  distopt::JobConfig cfg = distopt::load_job_config(t.file("plain.yaml"));
  distopt::ProcessInfo one;
  distopt::Runtime rt = distopt::Runtime::from_config(cfg, one);
  torch::nn::Linear model(2, 2);
  distopt::DistributedOptimizer opt = rt.make_optimizer(*model);
  CHECK_THROWS_WITH_AS(distopt::Elastic(rt, *model, opt),
                       doctest::Contains("elastic.enabled is false"), distopt::ConfigError);
}
