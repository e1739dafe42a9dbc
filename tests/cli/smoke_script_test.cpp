// tools/gpu/smoke.sh off the GPU machine: it stops at once naming the missing
// GPU, and its cpu mode runs rows to completion and prints one table with the
// logs in $OUT (a few rows only, so the test stays short).
#include <dirent.h>
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "multiproc.hpp"

using distopt::test::env_path;
using distopt::test::ProcResult;
using distopt::test::run_command;

namespace {

std::string script() { return env_path("DISTOPT_SOURCE_DIR") + "/tools/gpu/smoke.sh"; }

// Files in `dir` (not . and ..).
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

struct OutDir {
  std::string path;
  OutDir() {
    char tmpl[] = "/tmp/distopt_smoke_test_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~OutDir() {
    for (const auto& f : files_in(path)) ::unlink((path + "/" + f).c_str());
    ::rmdir(path.c_str());
  }
};

}  // namespace

TEST_CASE("smoke.sh without a GPU stops at once with 'no CUDA device' (exit 2)") {
  OutDir out;
  // No row selected: on a GPU machine it prints an empty table and exits 0
  // (never the whole smoke run, nor ctest inside ctest).
  ProcResult r = run_command({"bash", script()}, {"DISTOPT_SMOKE_ROWS=^$", "OUT=" + out.path},
                             std::chrono::seconds(60));
  INFO(r.output);
  if (r.output.find("no CUDA device") != std::string::npos) {
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("DISTOPT_SMOKE_DEVICE=cpu") != std::string::npos);
  } else {
    MESSAGE("a GPU is visible: the no-GPU path is not run");
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("distopt GPU smoke (cuda") != std::string::npos);
  }
}

TEST_CASE("smoke.sh cpu mode: plugins, a training row and checkpoint/resume/consolidate PASS") {
  OutDir out;
  ProcResult r =
      run_command({"bash", script()},
                  {"DISTOPT_SMOKE_DEVICE=cpu",
                   "DISTOPT_SMOKE_ROWS=^(plugins|allreduce|checkpoint)$", "OUT=" + out.path},
                  std::chrono::seconds(240));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("distopt GPU smoke (cpu, communicator tcp") != std::string::npos);
  CHECK(std::regex_search(r.output,
                          std::regex(R"(\nrow\s+status\s+accuracy\s+samples/s\s+secs\s+note\n)")));
  CHECK(std::regex_search(r.output, std::regex(R"(\nplugins\s+PASS\s)")));
  // A training row to completion: test accuracy and samples/s (the smoke's
  // floor is 0.20; chance is 0.10).
  CHECK(std::regex_search(r.output, std::regex(R"(\nallreduce\s+PASS\s+0\.\d{4}\s+\d+\s+\d+\s)")));
  CHECK(std::regex_search(
      r.output,
      std::regex(R"(\ncheckpoint\s+PASS\s+0\.\d{4}\s.*save, resume at epoch 2, consol)")));
  CHECK(r.output.find("FAIL") == std::string::npos);
  // Logs: at most 8 files, the table among them.
  auto files = files_in(out.path);
  CHECK(files.size() <= 8);
  CHECK(std::find(files.begin(), files.end(), "smoke-table.txt") != files.end());
}

TEST_CASE(
    "smoke.sh cpu mode: bench step with --align-bytes and train vs pytorch; SKIP drops rows") {
  OutDir out;
  ProcResult r = run_command(
      {"bash", script()},
      {"DISTOPT_SMOKE_DEVICE=cpu", "DISTOPT_SMOKE_ROWS=^(plugins|bench step|train vs pytorch)$",
       "DISTOPT_SMOKE_SKIP=^plugins$", "OUT=" + out.path},
      std::chrono::seconds(300));
  INFO(r.output);
  if (r.output.find("No module named 'torch'") != std::string::npos) {
    MESSAGE("no python3 with torch here: train_vs_pytorch.py cannot run");
    return;
  }
  REQUIRE(r.exit_code == 0);
  CHECK_FALSE(std::regex_search(r.output, std::regex(R"(\nplugins\s+PASS)")));
  // The default fused row and the 16-byte one, each parsed into the note.
  CHECK(std::regex_search(
      r.output,
      std::regex(R"(\nbench step\s+PASS\s.*fused [0-9.]+,.*align_bytes 16: fused [0-9.]+)")));
  // train vs pytorch: both sides trained, the steady epoch compared.
  CHECK(std::regex_search(
      r.output,
      std::regex(R"(\ntrain vs pytorch\s+PASS\s+0\.\d{4}\s+\d+\s+\d+\s+pytorch: \d+ samples/s)")));
  CHECK(r.output.find("FAIL") == std::string::npos);
}
