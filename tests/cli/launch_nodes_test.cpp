// Jobs over several "nodes" on loopback: two `distopt launch --nnodes 2
// --node-rank R` processes, four Slurm-like tasks (`srun distopt train`), and
// two launchers inside a Slurm-like step, each against 4 ranks started at once.
#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "job_yaml.hpp"
#include "train_metrics.hpp"

using distopt::test::ProcResult;
using distopt::test::random_port;
using distopt::test::run_command;
using namespace distopt::test::cli;
using nlohmann::json;

namespace {

const char* const kData = distopt::test::kFashionMnistDir;

// A 4-rank job: tcp / mean / allreduce, the MLP, a few steps, one thread per rank.
std::string write_job(const TempDir& t) {
  distopt::test::JobYaml j = distopt::test::allreduce_job(4);
  j.train->epochs = 1;
  j.train->batch_size = 32;
  j.train->max_steps = 12;
  j.train->log_every = 4;
  j.train->more = std::string(", data_dir: ") + kData;
  return distopt::test::write_job(t.file("job.yaml"), j);
}

json summary_of(const std::string& metrics) {
  std::ifstream f(metrics);
  json last;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) last = json::parse(line);
  REQUIRE_MESSAGE(last.is_object(), metrics << " has no metrics");
  REQUIRE(last["event"] == "summary");
  return last;
}

json epoch_of(const std::string& metrics) {
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && json::parse(line)["event"] == "epoch") return json::parse(line);
  FAIL(metrics << " has no epoch line");
  return {};
}

// The same training: same world size, test accuracy and losses as the reference.
void check_same_training(const std::string& ref, const std::string& got) {
  const json a = summary_of(ref), b = summary_of(got);
  CHECK(b["world_size"] == 4);
  CHECK(a["samples"] == b["samples"]);
  CHECK(a["final_test_accuracy"].get<double>() == b["final_test_accuracy"].get<double>());
  const json ea = epoch_of(ref), eb = epoch_of(got);
  CHECK(ea["train_loss"].get<double>() ==
        doctest::Approx(eb["train_loss"].get<double>()).epsilon(1e-6));
  CHECK(ea["test_loss"].get<double>() ==
        doctest::Approx(eb["test_loss"].get<double>()).epsilon(1e-6));
  CHECK(b["final_test_accuracy"].get<double>() > 0.3);  // it learnt (chance: 0.1)
}

// Reference: 4 ranks started at once by `distopt train` itself.
std::string reference_run(const TempDir& t, const std::string& job) {
  const std::string m = t.file("reference.jsonl");
  ProcResult r = run_command({cli(), "train", job, "--metrics", m}, {}, std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return m;
}

// Start the commands together and wait for each; every one must succeed.
void run_all(const std::vector<std::vector<std::string>>& cmds,
             const std::vector<std::vector<std::string>>& envs) {
  std::vector<std::unique_ptr<Background>> procs;
  for (size_t i = 0; i < cmds.size(); ++i) {
    // Background takes no environment: wrap in env(1).
    std::vector<std::string> argv = {"env"};
    for (const auto& kv : envs[i]) argv.push_back(kv);
    argv.insert(argv.end(), cmds[i].begin(), cmds[i].end());
    procs.push_back(std::make_unique<Background>(argv));
  }
  for (size_t i = 0; i < procs.size(); ++i) {
    const int code = procs[i]->wait(std::chrono::seconds(300));
    INFO("process " << i << " output:\n" << procs[i]->output);
    CHECK(code == 0);
  }
}

}  // namespace

TEST_CASE("two launchers with --nnodes 2 number the ranks across nodes and share a rendezvous") {
  const int port = random_port();
  std::vector<std::vector<std::string>> cmds;
  for (int node = 0; node < 2; ++node)
    cmds.push_back({cli(), "launch", "--nnodes", "2", "--node-rank", std::to_string(node),
                    "--nproc-per-node", "2", "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                    "--", "sh", "-c",
                    "echo env r=$DISTOPT_RANK w=$DISTOPT_WORLD_SIZE lr=$DISTOPT_LOCAL_RANK "
                    "lw=$DISTOPT_LOCAL_WORLD_SIZE rv=$DISTOPT_RENDEZVOUS "
                    "node=$DISTOPT_NODE_ID tok=$DISTOPT_JOB_TOKEN"});
  std::vector<std::unique_ptr<Background>> procs;
  for (auto& c : cmds) procs.push_back(std::make_unique<Background>(c));
  std::set<std::string> tokens;
  std::set<int> ranks;
  for (int node = 0; node < 2; ++node) {
    REQUIRE(procs[node]->wait(std::chrono::seconds(60)) == 0);
    const std::string& out = procs[node]->output;
    INFO(out);
    CHECK(out.find("node " + std::to_string(node) + " of 2: ranks " + std::to_string(2 * node) +
                   ".." + std::to_string(2 * node + 1) + " of 4") != std::string::npos);
    std::regex re(
        R"(\[rank (\d)\] env r=(\d) w=4 lr=(\d) lw=2 rv=tcp://127\.0\.0\.1:(\d+) node=node(\d) tok=(\S+))");
    int seen = 0;
    for (const auto& l : lines_of(out)) {
      std::smatch m;
      if (!std::regex_match(l, m, re)) continue;
      ++seen;
      const int r = std::stoi(m[2]);
      CHECK(m[1] == m[2]);  // the prefix names the global rank
      CHECK(r / 2 == node);
      CHECK(std::stoi(m[3]) == r % 2);
      CHECK(std::stoi(m[4]) == port);
      CHECK(std::stoi(m[5]) == node);
      ranks.insert(r);
      tokens.insert(m[6]);
    }
    CHECK(seen == 2);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(tokens.size() == 1);  // both nodes give the same job token
}

TEST_CASE("launch refuses inconsistent node options, naming them") {
  ProcResult r = run_command({cli(), "launch", "--nnodes", "2", "-n", "1", "--", "true"});
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--master-port") != std::string::npos);
  r = run_command({cli(), "launch", "--nnodes", "2", "--node-rank", "2", "-n", "1", "--master-port",
                   "29999", "--", "true"});
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--node-rank") != std::string::npos);
  r = run_command({cli(), "launch", "-n", "1", "--rdzv-endpoint", "hostonly", "--", "true"});
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--rdzv-endpoint") != std::string::npos);
  r = run_command({cli(), "launch", "--help"});
  CHECK(r.exit_code == 0);
  for (const char* opt : {"--nnodes", "--node-rank", "--nproc-per-node", "--master-addr",
                          "--master-port", "--rdzv-endpoint", "--rdzv-id", "SLURM_PROCID"})
    CHECK_MESSAGE(r.output.find(opt) != std::string::npos, opt);
}

TEST_CASE("launch --nnodes MIN:MAX: refused without --elastic, -n or a port, and when MIN > MAX") {
  auto refused = [](std::vector<std::string> args, const std::string& names) {
    std::vector<std::string> argv = {cli(), "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--", "true"});
    ProcResult r = run_command(argv);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(names) != std::string::npos);
  };
  refused({"--nnodes", "1:3", "-n", "1", "--master-port", "29999"}, "needs --elastic");
  refused({"--elastic", "--join", "--nnodes", "1:3", "-n", "1", "--master-port", "29999",
           "--rdzv-id", "x"},
          "needs --elastic and no --join");
  refused({"--elastic", "--nnodes", "3:2", "-n", "1", "--master-port", "29999"},
          "MIN is above MAX");
  refused({"--elastic", "--nnodes", "2:x", "-n", "1", "--master-port", "29999"}, "MIN:MAX");
  refused({"--elastic", "--nnodes", "1:3", "--master-port", "29999"}, "give -n K");
  refused({"--elastic", "--nnodes", "1:3", "-n", "1"}, "--master-port");
  ProcResult r = run_command({cli(), "launch", "--help"});
  CHECK(r.output.find("--rdzv-settle") != std::string::npos);
}

TEST_CASE("inside an sbatch script (no srun step): launch runs this node, train is refused") {
  const std::vector<std::string> batch = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=4244",
                                          "SLURM_JOB_NODELIST=127.0.0.1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), batch.begin(), batch.end());
    return extra;
  };
  // Two nodes: the script runs on the first only; one launcher per node is needed.
  ProcResult r =
      run_command({cli(), "launch", "-n", "2", "--", "true"}, with({"SLURM_JOB_NUM_NODES=2"}));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("sbatch script on the first of 2 nodes") != std::string::npos);
  CHECK(r.output.find("srun --ntasks-per-node=1 distopt launch") != std::string::npos);
  // One node: a plain local launch of -n ranks.
  r = run_command(
      {cli(), "launch", "-n", "2", "--", "sh", "-c", "echo rank=$DISTOPT_RANK/$DISTOPT_WORLD_SIZE"},
      with({"SLURM_JOB_NUM_NODES=1"}));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("rank=0/2") != std::string::npos);
  CHECK(r.output.find("rank=1/2") != std::string::npos);
  // distopt train in the script itself would wait for a rank nobody starts.
  TempDir t;
  const std::string job = t.file("job.yaml");
  std::ofstream(job) << "world: {size: 2}\n";
  r = run_command({cli(), "train", job}, with({"SLURM_JOB_NUM_NODES=1"}));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("SLURM_NTASKS=2 but this process is not one of 2 srun tasks") !=
        std::string::npos);
}

TEST_CASE("launch says that its rendezvous replaces the job file's") {
  TempDir t;
  const std::string job = t.file("job.yaml");
  std::ofstream(job) << "world: {size: 1, rendezvous: 'tcp://127.0.0.1:29517'}\n";
  ProcResult r = run_command(
      {cli(), "launch", "--config", job, "--", "sh", "-c", "echo rv=$DISTOPT_RENDEZVOUS"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find(job + ":1: world.rendezvous 'tcp://127.0.0.1:29517' is not used") !=
        std::string::npos);
  // Given the same address, nothing to say.
  r = run_command({cli(), "launch", "--config", job, "--master-port", "29517", "--", "true"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("is not used") == std::string::npos);
  // `distopt train` starting its own ranks says the same (the ranks then
  // fail at once on the missing data set: only the note matters here).
  const std::string job2 = t.file("job2.yaml");
  std::ofstream(job2) << "world: {size: 2, rendezvous: 'tcp://127.0.0.1:29518'}\n"
                      << "train: {data_dir: " << t.file("no-data") << "}\n";
  r = run_command({cli(), "train", job2});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("distopt train: " + job2 +
                      ":1: world.rendezvous 'tcp://127.0.0.1:29518' is not used: the launched "
                      "ranks meet at tcp://127.0.0.1:") != std::string::npos);
}

TEST_CASE("2 nodes x 2 ranks train as 4 ranks at once: launch --nnodes, srun, launch in srun") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string job = write_job(t);
  const std::string ref = reference_run(t, job);

  SUBCASE("distopt launch --nnodes 2 --node-rank R") {
    const int port = random_port();
    const std::string m = t.file("nodes.jsonl");
    std::vector<std::vector<std::string>> cmds;
    for (int node = 0; node < 2; ++node)
      cmds.push_back({cli(), "launch", "--nnodes", "2", "--node-rank", std::to_string(node),
                      "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                      std::to_string(port), "--", cli(), "train", job, "--metrics", m});
    run_all(cmds, {{}, {}});
    check_same_training(ref, m);
  }
  SUBCASE("srun distopt train: four Slurm tasks on two nodes") {
    const int port = random_port();
    const std::string m = t.file("slurm.jsonl");
    std::vector<std::vector<std::string>> cmds, envs;
    for (int r = 0; r < 4; ++r) {
      cmds.push_back({cli(), "train", job, "--metrics", m});
      envs.push_back({"SLURM_PROCID=" + std::to_string(r), "SLURM_NTASKS=4",
                      "SLURM_LOCALID=" + std::to_string(r % 2),
                      "SLURM_NODEID=" + std::to_string(r / 2), "SLURM_TASKS_PER_NODE=2(x2)",
                      "SLURM_JOB_NODELIST=127.0.0.[1-2]", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0",
                      "SLURM_STEP_NUM_TASKS=4", "MASTER_PORT=" + std::to_string(port)});
    }
    run_all(cmds, envs);
    check_same_training(ref, m);
  }
  SUBCASE("distopt launch -n 2 inside a Slurm step of one task per node") {
    const int port = random_port();
    const std::string m = t.file("slurm_launch.jsonl");
    std::vector<std::vector<std::string>> cmds, envs;
    for (int node = 0; node < 2; ++node) {
      cmds.push_back({cli(), "launch", "-n", "2", "--", cli(), "train", job, "--metrics", m});
      envs.push_back({"SLURM_PROCID=" + std::to_string(node), "SLURM_NTASKS=2", "SLURM_NNODES=2",
                      "SLURM_NODEID=" + std::to_string(node), "SLURM_JOB_NODELIST=127.0.0.[1-2]",
                      "SLURM_JOB_ID=4243", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_TASKS=2",
                      "MASTER_PORT=" + std::to_string(port)});
    }
    run_all(cmds, envs);
    check_same_training(ref, m);
  }
}
