// The kernel-set rule as a table (every case, whatever this machine's CPU),
// and the threads-per-rank rule.
#include <ATen/Parallel.h>
#include <doctest/doctest.h>
#include <sched.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "distopt/blas.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "distopt/threads.hpp"

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
  char tmpl[] = "/tmp/distopt_threads_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string path = std::string(tmpl) + "/job.yaml";
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
