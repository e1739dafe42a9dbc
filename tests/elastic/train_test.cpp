// Elastic training as a user meets it: `distopt train` with `elastic:` on 4
// real ranks, one killed mid-training: the job finishes on 3, and its final
// state equals (bitwise) a 3-rank run resumed from a disk checkpoint of the
// step the survivors rolled back to. Also: two ranks killed at once (their
// shards survive through buddies, or are lost together and the job says
// so), fewer survivors than min_ranks, the C++ API refusing a job without
// elastic.enabled.
#include <torch/serialize.h>

#include <fstream>

#include "torch_doctest.hpp"
// after doctest:
#include "cli_train_util.hpp"
#include "cli_util.hpp"
#include "job_yaml.hpp"
#include "train_metrics.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using namespace distopt::test::cli;

namespace {

const char* const kData = distopt::test::kFashionMnistDir;
constexpr int kSteps = 24;

struct Job {
  std::string algorithm = "{name: allreduce}";
  std::string reducer = "{name: mean}";
  std::string elastic = "{enabled: true}";
  std::string precision;  // `precision:` ("" = absent)
  int world = 4;
};

std::string write_job(const TempDir& t, const Job& j, const std::string& name) {
  distopt::test::JobYaml y = distopt::test::allreduce_job(j.world);
  y.timeout_s = 30;
  y.algorithm = j.algorithm;
  y.reducer = j.reducer;
  y.optimizer = "{name: adam, lr: 0.002}";
  distopt::test::TrainYaml& train = *y.train;
  train.epochs = 1;
  train.batch_size = 24;
  train.seed = 5;
  train.max_steps = kSteps;
  train.log_every = 0;
  // 96 divides among 4 and 3 ranks alike.
  train.more = ", global_batch_size: 96, data_dir: " + std::string(kData);
  if (!j.elastic.empty()) y.extra = "elastic: " + j.elastic + "\n";
  if (!j.precision.empty()) y.extra += "precision: " + j.precision + "\n";
  return distopt::test::write_job(t.file(name), y);
}

// Kill rank `victim` of 4 before global step 10: the survivors roll back to
// the commit of step 9 and finish on 3 ranks. Reference: 4 ranks to step 9
// (a disk checkpoint there), then 3 ranks resumed from it.
void killed_equals_resumed(const std::string& algorithm, int victim,
                           const std::string& reducer = "{name: mean}",
                           const std::string& precision = "") {
  TempDir t;
  Job j;
  j.algorithm = algorithm;
  j.reducer = reducer;
  j.precision = precision;
  const std::string cfg = write_job(t, j, "job.yaml");

  ProcResult e = train(cfg, {"--checkpoint", t.file("e")},
                       {"DISTOPT_FAULT_INJECT=exit:" + std::to_string(victim) + ":10"});
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  CHECK(e.output.find("elastic: generation 1: 3 rank(s) go on (lost rank(s) " +
                      std::to_string(victim) + " of 4), back at epoch 1 step 9") !=
        std::string::npos);
  CHECK(e.output.find("summary: 3 rank(s)") != std::string::npos);

  ProcResult a =
      train(cfg, {"--checkpoint", t.file("a"), "--checkpoint-every", "9", "--keep", "5"});
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  ProcResult b = train(cfg, {"--world-size", "3", "--checkpoint", t.file("b"), "--resume-from",
                             t.file("a") + "/step-000000009"});
  INFO(b.output);
  REQUIRE(b.exit_code == 0);

  auto ce = consolidated(t.file("e"), t.file("e.pt"));
  auto cb = consolidated(t.file("b"), t.file("b.pt"));
  CHECK(ce.at("step").toInt() == kSteps);
  CHECK(cb.at("step").toInt() == kSteps);
  check_equal_section(ce, cb, "model");
  check_equal_section(ce, cb, "optimizer_state");
  if (!precision.empty()) check_equal_section(ce, cb, "state");  // the fp32 masters
}

}  // namespace

TEST_CASE("allreduce: a rank killed at step 10 of 4; 3 go on, bitwise a 3-rank resume") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: allreduce}", 2);
}

TEST_CASE("zero stage 1: rank 0's shard comes from its buddy and is resharded to 3 ranks") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: zero, options: {stage: 1}}", 0);
}

TEST_CASE("zero stage 2: the last rank's shard comes from rank 0, its buddy") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: zero, options: {stage: 2}}", 3);
}

TEST_CASE("zero stage 3: the killed rank's parameter shards come from its buddy, 4 -> 3 ranks") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: zero, options: {stage: 3}}", 1);
}

TEST_CASE("zero stage 3 in bf16: the fp32 master shards and the loss scale come back, 4 -> 3") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: zero, options: {stage: 3}}", 2, "{name: mean}", "{dtype: bf16}");
}

TEST_CASE("hybrid shard: true: the offloaded shard of the killed rank comes from its buddy") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: hybrid, options: {shard: true, offload_fraction: 0.5}}", 1);
}

TEST_CASE("powersgd: Q and the error feedback roll back; the lost rank's residual as on resume") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: allreduce}", 2,
                        "{name: powersgd, options: {rank: 2, start_iter: 1, "
                        "min_compression_rate: 1}}");
}

TEST_CASE("decentralized ring: the replicas roll back and go on as a ring of 3") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: decentralized, options: {topology: ring}}", 1);
}

TEST_CASE("local_sgd period 4: a rank killed between averagings") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  killed_equals_resumed("{name: local_sgd, options: {period: 4}}", 3);
}

TEST_CASE("two ranks killed at once: non-neighbours recover on 2, neighbours lose a shard") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.algorithm = "{name: zero, options: {stage: 1}}";
  const std::string cfg = write_job(t, j, "job.yaml");
  ProcResult two = train(cfg, {}, {"DISTOPT_FAULT_INJECT=exit:1:6,exit:3:6"});
  INFO(two.output);
  CHECK(two.exit_code == 0);
  CHECK(two.output.find("2 rank(s) go on (lost rank(s) 1,3 of 4), back at epoch 1 step 5") !=
        std::string::npos);
  CHECK(two.output.find("summary: 2 rank(s)") != std::string::npos);

  // Ranks 1 and 2: rank 1's shard and its only copy (on rank 2) are gone.
  ProcResult lost = train(cfg, {}, {"DISTOPT_FAULT_INJECT=exit:1:6,exit:2:6"});
  INFO(lost.output);
  CHECK(lost.exit_code != 0);
  CHECK(lost.output.find("the in-memory state of rank(s) 1 of 4 was lost together with its buddy "
                         "copy") != std::string::npos);
}

TEST_CASE("a rank dying during the recovery: the others try again with the ranks left") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.algorithm = "{name: zero, options: {stage: 1}}";
  const std::string cfg = write_job(t, j, "job.yaml");
  // Rank 1 dies at step 8; rank 3 dies after the survivors agreed on
  // {0, 2, 3}, before the communicators exist: 0 and 2 fail to connect to
  // it, agree again without it and go on from the same commit.
  ProcResult r = train(cfg, {}, {"DISTOPT_FAULT_INJECT=exit:1:8,elastic_exit:3:connect"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("DISTOPT_FAULT_INJECT: rank 3 exits (137) in the recovery (connect)") !=
        std::string::npos);
  CHECK(r.output.find("elastic: generation 2: 2 rank(s) go on (lost rank(s) 1,3 of 4), back at "
                      "epoch 1 step 7") != std::string::npos);
  CHECK(r.output.find("summary: 2 rank(s), 24 steps") != std::string::npos);

  // Dying before it arrives: the launcher has declared it dead; one generation.
  ProcResult a = train(cfg, {}, {"DISTOPT_FAULT_INJECT=exit:1:8,elastic_exit:3:arrive"});
  INFO(a.output);
  CHECK(a.exit_code == 0);
  CHECK(a.output.find("2 rank(s) go on (lost rank(s) 1,3 of 4), back at epoch 1 step 7") !=
        std::string::npos);
}

TEST_CASE("fewer survivors than elastic.min_ranks end the job naming the key") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.elastic = "{enabled: true, min_ranks: 4}";
  const std::string cfg = write_job(t, j, "job.yaml");
  ProcResult r = train(cfg, {}, {"DISTOPT_FAULT_INJECT=exit:2:4"});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("3 rank(s) survive, fewer than elastic.min_ranks = 4") != std::string::npos);
}

TEST_CASE("a 5th rank joins 4 (launch --elastic --join): bitwise a 5-rank resume from the join") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job j;
  j.algorithm = "{name: zero, options: {stage: 1}}";
  j.elastic = "{enabled: true, max_ranks: 5}";
  const std::string cfg = write_job(t, j, "job.yaml");
  const int port = distopt::test::random_port();
  const std::string token = "elastic-train-join-" + std::to_string(port);
  // Every rank waits before step 6 until the 5th has asked: it is taken in
  // at a commit by then, whatever the machine's speed.
  const std::string wait = "DISTOPT_FAULT_INJECT=wait_join:6";
  setenv("DISTOPT_FAULT_INJECT", "wait_join:6", 1);
  Background running({cli(), "launch", "--elastic", "-n", "4", "--master-port",
                      std::to_string(port), "--rdzv-id", token, "--", cli(), "train", cfg,
                      "--checkpoint", t.file("e")});
  unsetenv("DISTOPT_FAULT_INJECT");
  ProcResult joined = run_command(
      {cli(), "launch", "--elastic", "--join", "-n", "1", "--master-port", std::to_string(port),
       "--rdzv-id", token, "--", cli(), "train", cfg, "--checkpoint", t.file("e")},
      {wait}, std::chrono::seconds(240));
  const int code = running.wait(std::chrono::seconds(240));
  INFO(running.output);
  INFO(joined.output);
  REQUIRE(joined.exit_code == 0);
  REQUIRE(code == 0);
  const std::string taking = "taking in 1 rank(s) at optimizer step ";
  const size_t at = running.output.find(taking);
  REQUIRE(at != std::string::npos);
  const int64_t step = std::stoll(running.output.substr(at + taking.size()));
  CHECK(step <= 6);
  CHECK(joined.output.find("joined as rank 4 of 5 at epoch 1 step " + std::to_string(step)) !=
        std::string::npos);
  CHECK(running.output.find("summary: 5 rank(s)") != std::string::npos);

  // Reference: 4 ranks to that step (a disk checkpoint there), then 5.
  ProcResult a = train(cfg, {"--checkpoint", t.file("a"), "--checkpoint-every",
                             std::to_string(step), "--keep", std::to_string(kSteps)});
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  char dir[32];
  std::snprintf(dir, sizeof dir, "/step-%09lld", static_cast<long long>(step));
  ProcResult b = train(
      cfg, {"--world-size", "5", "--checkpoint", t.file("b"), "--resume-from", t.file("a") + dir});
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  auto ce = consolidated(t.file("e"), t.file("e.pt"));
  auto cb = consolidated(t.file("b"), t.file("b.pt"));
  CHECK(ce.at("step").toInt() == kSteps);
  check_equal_section(ce, cb, "model");
  check_equal_section(ce, cb, "optimizer_state");  // the new rank's shard included
}
