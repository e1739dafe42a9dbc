// Rank detection from the launchers' environments (distopt, Slurm, Open MPI)
// and the Slurm helpers: host-list expansion, tasks per node, default port.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

#include "distopt/error.hpp"
#include "distopt/process.hpp"
#include "distopt/slurm.hpp"

using distopt::expand_slurm_nodelist;

namespace {

// Every variable detect_process_info reads, cleared, then `vars` set; the
// previous values come back at the end of the scope.
class EnvGuard {
 public:
  explicit EnvGuard(const std::map<std::string, std::string>& vars) {
    for (const char* k : {"DISTOPT_RANK",
                          "DISTOPT_WORLD_SIZE",
                          "DISTOPT_LOCAL_RANK",
                          "DISTOPT_LOCAL_WORLD_SIZE",
                          "DISTOPT_RENDEZVOUS",
                          "DISTOPT_JOB_TOKEN",
                          "RANK",
                          "WORLD_SIZE",
                          "LOCAL_RANK",
                          "LOCAL_WORLD_SIZE",
                          "MASTER_ADDR",
                          "MASTER_PORT",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_LOCALID",
                          "SLURM_NTASKS_PER_NODE",
                          "SLURM_TASKS_PER_NODE",
                          "SLURM_NODEID",
                          "SLURM_JOB_NODELIST",
                          "SLURM_STEP_NODELIST",
                          "SLURM_NODELIST",
                          "SLURM_JOB_ID",
                          "SLURM_JOBID",
                          "SLURM_STEP_ID",
                          "SLURM_STEPID",
                          "SLURM_STEP_NUM_TASKS",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
      if (const char* v = getenv(k)) saved_[k] = v;
      unsetenv(k);
      touched_.push_back(k);
    }
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~EnvGuard() {
    for (const auto& k : touched_) unsetenv(k.c_str());
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
  std::vector<std::string> touched_;
};

using Hosts = std::vector<std::string>;

}  // namespace

TEST_CASE("Slurm host lists expand in order, keeping zero padding") {
  CHECK(expand_slurm_nodelist("node01") == Hosts{"node01"});
  CHECK(expand_slurm_nodelist("a,b") == Hosts{"a", "b"});
  CHECK(expand_slurm_nodelist("node[01-04,07]") ==
        Hosts{"node01", "node02", "node03", "node04", "node07"});
  CHECK(expand_slurm_nodelist("gpu[9-11]") == Hosts{"gpu9", "gpu10", "gpu11"});
  CHECK(expand_slurm_nodelist("login,cn[098-100]-ib,x") ==
        Hosts{"login", "cn098-ib", "cn099-ib", "cn100-ib", "x"});
  CHECK(expand_slurm_nodelist("r[1-2]n[1,3]") == Hosts{"r1n1", "r1n3", "r2n1", "r2n3"});
  CHECK(expand_slurm_nodelist("127.0.0.[1-2]") == Hosts{"127.0.0.1", "127.0.0.2"});
  CHECK(expand_slurm_nodelist("").empty());
}

TEST_CASE("malformed Slurm host lists are errors naming the variable") {
  for (const char* bad : {"node[01-04", "node01]", "node[4-1]", "node[a-b]", "n[1,,2]"}) {
    INFO(bad);
    try {
      expand_slurm_nodelist(bad, "SLURM_JOB_NODELIST");
      FAIL("accepted");
    } catch (const distopt::ConfigError& e) {
      CHECK(std::string(e.what()).find("SLURM_JOB_NODELIST") != std::string::npos);
    }
  }
}

TEST_CASE("Slurm tasks per node: N(xK) runs") {
  CHECK(distopt::slurm_tasks_on_node("4", 0) == 4);
  CHECK(distopt::slurm_tasks_on_node("2(x3),1", 0) == 2);
  CHECK(distopt::slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(distopt::slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK_THROWS_AS(distopt::slurm_tasks_on_node("2(x3),1", 4), distopt::ConfigError);
  CHECK_THROWS_AS(distopt::slurm_tasks_on_node("2(x", 0), distopt::ConfigError);
}

TEST_CASE("srun's environment: ranks, the master from the node list, a job token") {
  EnvGuard g({{"SLURM_PROCID", "3"},
              {"SLURM_NTASKS", "4"},
              {"SLURM_LOCALID", "1"},
              {"SLURM_TASKS_PER_NODE", "2(x2)"},
              {"SLURM_NODEID", "1"},
              {"SLURM_JOB_NODELIST", "node[07-08]"},
              {"SLURM_JOB_ID", "12345"},
              {"SLURM_STEP_ID", "0"},
              {"SLURM_STEP_NUM_TASKS", "4"}});
  distopt::ProcessInfo p = distopt::detect_process_info();
  CHECK(p.source == "slurm");
  CHECK(p.rank == 3);
  CHECK(p.world_size == 4);
  CHECK(p.local_rank == 1);
  CHECK(p.local_world_size == 2);
  CHECK(p.rendezvous == "tcp://node07:" + std::to_string(29500 + 12345 % 1000));
  CHECK(distopt::slurm_default_port() == 29845);
  CHECK(p.token == "slurm-12345.0");
  {
    // SLURM_NTASKS_PER_NODE wins over the list; MASTER_ADDR / MASTER_PORT over the defaults.
    EnvGuard g2({{"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_STEP_NUM_TASKS", "8"},
                 {"SLURM_NTASKS_PER_NODE", "4"},
                 {"SLURM_TASKS_PER_NODE", "3"},
                 {"SLURM_JOB_NODELIST", "node[07-08]"},
                 {"MASTER_ADDR", "10.0.0.5"},
                 {"DISTOPT_JOB_TOKEN", "tok"}});
    distopt::ProcessInfo q = distopt::detect_process_info();
    CHECK(q.local_world_size == 4);
    CHECK(q.rendezvous == "tcp://10.0.0.5:29500");
    CHECK(q.token == "tok");
    setenv("MASTER_PORT", "31000", 1);
    CHECK(distopt::detect_process_info().rendezvous == "tcp://10.0.0.5:31000");
  }
  {
    EnvGuard g3({{"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_STEP_NUM_TASKS", "2"},
                 {"SLURM_JOB_NODELIST", "n[1-"}});
    CHECK_THROWS_AS(distopt::detect_process_info(), distopt::ConfigError);
  }
}

TEST_CASE("an sbatch script is not an srun task: refused with what to run instead") {
  auto message = [] {
    try {
      distopt::detect_process_info();
    } catch (const distopt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // The batch step: the allocation's SLURM_NTASKS, SLURM_PROCID=0, no step.
  std::map<std::string, std::string> batch{{"SLURM_PROCID", "0"},
                                           {"SLURM_NTASKS", "4"},
                                           {"SLURM_JOB_NODELIST", "node[07-08]"},
                                           {"SLURM_JOB_ID", "12345"}};
  {
    EnvGuard g(batch);
    const std::string m = message();
    CAPTURE(m);
    CHECK(m.find("SLURM_NTASKS=4 but this process is not one of 4 srun tasks "
                 "(SLURM_STEP_NUM_TASKS is not set") != std::string::npos);
    CHECK(m.find("srun distopt train JOB.yaml") != std::string::npos);
  }
  {
    // srun -n 2 --preserve-env inside a 4-task allocation: 2 tasks, not 4.
    auto vars = batch;
    vars["SLURM_STEP_NUM_TASKS"] = "2";
    EnvGuard g(vars);
    CHECK(message().find("(SLURM_STEP_NUM_TASKS is 2;") != std::string::npos);
  }
  {
    auto vars = batch;
    vars["SLURM_STEP_NUM_TASKS"] = "4";
    EnvGuard g(vars);
    CHECK(message().empty());
    CHECK(distopt::detect_process_info().world_size == 4);
  }
  {
    // One task (an sbatch of --ntasks=1) is a world of one: nothing to wait for.
    auto vars = batch;
    vars["SLURM_NTASKS"] = "1";
    EnvGuard g(vars);
    CHECK(message().empty());
  }
}

TEST_CASE("distopt's and Open MPI's environments still win / still work") {
  {
    EnvGuard g({{"DISTOPT_RANK", "1"},
                {"DISTOPT_WORLD_SIZE", "2"},
                {"DISTOPT_RENDEZVOUS", "tcp://127.0.0.1:1234"},
                {"SLURM_PROCID", "5"},
                {"SLURM_NTASKS", "8"},
                {"SLURM_JOB_NODELIST", "x"}});
    distopt::ProcessInfo p = distopt::detect_process_info();
    CHECK(p.source == "distopt");
    CHECK(p.rank == 1);
    CHECK(p.rendezvous == "tcp://127.0.0.1:1234");
  }
  {
    EnvGuard g({{"OMPI_COMM_WORLD_RANK", "2"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "5"}});
    distopt::ProcessInfo p = distopt::detect_process_info();
    CHECK(p.source == "openmpi");
    CHECK(p.rank == 2);
    CHECK(p.world_size == 4);
    CHECK(p.local_world_size == 2);
    CHECK(p.rendezvous == "tcp://h:5");
    CHECK(p.token.empty());
  }
  {
    EnvGuard g({});
    distopt::ProcessInfo p = distopt::detect_process_info();
    CHECK(p.source == "default");
    CHECK(p.world_size == 1);
    CHECK(p.rendezvous.empty());
  }
}
