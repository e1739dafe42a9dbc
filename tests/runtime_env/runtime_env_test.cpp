// The kernel-set rule as a table (every case, whatever this machine's CPU),
// and the threads-per-rank rule.
#include <ATen/Parallel.h>
#include <sched.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "distopt/blas.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"
#include "distopt/threads.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"  // last: after libtorch (glog) headers

using distopt::openblas_coretype_rule;

TEST_CASE("a generic OpenBLAS fallback is replaced by the best kernel set the CPU supports") {
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Atom", "PRESCOTT"}) {
    CAPTURE(generic);
    CHECK(openblas_coretype_rule(generic, "SkylakeX") == "SkylakeX");
    CHECK(openblas_coretype_rule(generic, "Haswell") == "Haswell");
    CHECK(openblas_coretype_rule(generic, "") == "");  // nothing better to offer
  }
  CHECK(openblas_coretype_rule("Haswell", "SkylakeX") == "SkylakeX");
}

TEST_CASE("a kernel set OpenBLAS chose for a CPU it recognised is kept") {
  for (const char* chosen : {"Cooperlake", "SkylakeX", "SapphireRapids", "Zen", "Haswell"}) {
    CAPTURE(chosen);
    if (std::string(chosen) != "Haswell") CHECK(openblas_coretype_rule(chosen, "SkylakeX") == "");
    CHECK(openblas_coretype_rule(chosen, "Haswell") == "");
  }
  CHECK(openblas_coretype_rule("", "SkylakeX") == "");  // not OpenBLAS
}

TEST_CASE(
    "an explicit OPENBLAS_CORETYPE is never overridden, and DISTOPT_BLAS_AUTOTUNE=0 turns the fix "
    "off") {
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  CHECK(distopt::openblas_coretype_fix() == "");
  unsetenv("OPENBLAS_CORETYPE");
  setenv("DISTOPT_BLAS_AUTOTUNE", "0", 1);
  CHECK(distopt::openblas_coretype_fix() == "");
  unsetenv("DISTOPT_BLAS_AUTOTUNE");
  // Otherwise the fix is the rule applied to this process's BLAS.
  CHECK(distopt::openblas_coretype_fix() ==
        openblas_coretype_rule(distopt::openblas_core_name(), distopt::best_openblas_coretype()));
}

TEST_CASE("the BLAS description names the kernels and the threading of OpenBLAS") {
  const std::string core = distopt::openblas_core_name();
  if (core.empty()) {
    CHECK(distopt::blas_description() == "not OpenBLAS");
    return;
  }
  const std::string threading = distopt::openblas_threading();
  CHECK((threading == "OpenMP" || threading == "pthreads" || threading == "sequential"));
  CHECK(distopt::blas_description().rfind("OpenBLAS, " + core + " kernels, " + threading, 0) == 0);
}

TEST_CASE(
    "threads per rank: the configured value, else OMP_NUM_THREADS, else cores / local ranks") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const int cores = CPU_COUNT(&set);
  CHECK(distopt::available_cores() == cores);
  CHECK(distopt::default_threads_per_rank(1) == cores);
  CHECK(distopt::default_threads_per_rank(cores) == 1);
  CHECK(distopt::default_threads_per_rank(4 * cores) == 1);  // never 0
  unsetenv("OMP_NUM_THREADS");
  CHECK(distopt::choose_threads_per_rank(0, 1) == cores);
  CHECK(distopt::choose_threads_per_rank(3, 1) == 3);
  setenv("OMP_NUM_THREADS", "5", 1);
  CHECK(distopt::choose_threads_per_rank(0, 1) == 5);
  CHECK(distopt::choose_threads_per_rank(2, 1) == 2);  // the config wins
  setenv("OMP_NUM_THREADS", "lots", 1);                // not a number: ignored
  CHECK(distopt::choose_threads_per_rank(0, 1) == cores);
  unsetenv("OMP_NUM_THREADS");
}

namespace {
// A one-rank job file: plugins from the build tree, optional train.threads.
std::string one_rank_job(const std::string& threads_line) {
  const char* plugins = std::getenv("DISTOPT_PLUGIN_DIR");
  REQUIRE_MESSAGE(plugins, "DISTOPT_PLUGIN_DIR is not set (run through ctest)");
  const std::string path = distopt::test::make_temp_dir("distopt_threads") + "/job.yaml";
  std::ofstream(path) << "plugins: {paths: [" << plugins << "]}\n"
                      << "world: {size: 1}\n"
                      << threads_line;
  return path;
}
}  // namespace

TEST_CASE("an embedding program gets the CLI's threads per rank from Runtime") {
  unsetenv("OMP_NUM_THREADS");
  const distopt::ProcessInfo one{0, 1, 0, 1, "", "", "test"};
  at::set_num_threads(7);  // whatever the program had: Runtime applies the rule
  {
    auto rt = distopt::Runtime::from_config(distopt::load_job_config(one_rank_job("")), one);
    CHECK(at::get_num_threads() == distopt::default_threads_per_rank(1));
  }
  {
    auto rt = distopt::Runtime::from_config(
        distopt::load_job_config(one_rank_job("train: {threads: 3}\n")), one);
    CHECK(at::get_num_threads() == 3);
  }
  setenv("OMP_NUM_THREADS", "2", 1);
  {
    auto rt = distopt::Runtime::from_config(distopt::load_job_config(one_rank_job("")), one);
    CHECK(at::get_num_threads() == 2);
  }
  unsetenv("OMP_NUM_THREADS");
}

TEST_CASE("Runtime::from_env reads the job file distopt launch --config exports") {
  unsetenv("DISTOPT_CONFIG");
  try {
    distopt::Runtime::from_env();
    FAIL("from_env without DISTOPT_CONFIG succeeded");
  } catch (const distopt::ConfigError& e) {
    CHECK(std::string(e.what()).find("DISTOPT_CONFIG is not set") != std::string::npos);
  }
  const std::string path = one_rank_job("train: {threads: 1}\n");
  setenv("DISTOPT_CONFIG", path.c_str(), 1);
  auto rt = distopt::Runtime::from_env();
  CHECK(rt.config().path == path);
  CHECK(rt.config().train.threads == 1);
  unsetenv("DISTOPT_CONFIG");
}

TEST_CASE("a rank that never starts is named by the rendezvous within world.timeout_s") {
  const char* plugins = std::getenv("DISTOPT_PLUGIN_DIR");
  REQUIRE(plugins);
  const int port = distopt::test::random_port();
  auto cfg = distopt::parse_job_config(std::string("plugins: {paths: [") + plugins +
                                           "]}\nworld: {size: 3, rendezvous: 'tcp://127.0.0.1:" +
                                           std::to_string(port) + "', timeout_s: 2}\n",
                                       "job.yaml");
  distopt::ProcessInfo rank0;
  rank0.world_size = rank0.local_world_size = 3;
  rank0.source = "test";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    distopt::Runtime::from_config(cfg, rank0);
    FAIL("rank 0 of 3 connected alone");
  } catch (const distopt::RendezvousError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("rank(s) 1, 2 never joined") != std::string::npos);
    CHECK(m.find("world.timeout_s") != std::string::npos);
  }
  // The job's timeout, not the communicator's default 60 s (limit generous
  // for a loaded machine; the bug was 61 s).
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("the communicator's timeout_s defaults to world.timeout_s unless set") {
  const char* plugins = std::getenv("DISTOPT_PLUGIN_DIR");
  REQUIRE(plugins);
  distopt::PluginRegistry reg;
  reg.discover({plugins});
  const std::string head = std::string("plugins: {paths: [") + plugins + "]}\n";
  auto v = distopt::validate_job(
      distopt::parse_job_config(head + "world: {timeout_s: 7}\ncommunicator: {name: tcp}\n"), reg);
  CHECK(v.communicator.get_double("timeout_s") == 7);
  v = distopt::validate_job(distopt::parse_job_config(head + "world: {timeout_s: 7}\n"
                                                             "communicator: {name: tcp, options: "
                                                             "{timeout_s: 30}}\n"),
                            reg);
  CHECK(v.communicator.get_double("timeout_s") == 30);
}
