// `distopt bench comm` and `distopt bench step` run and print their tables
// (smoke-sized: the numbers themselves are benchmarks, not test assertions).
#include <doctest/doctest.h>

#include <regex>
#include <sstream>
#include <string>

#include "cli_util.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using distopt::test::cli::cli;

namespace {
int count_matches(const std::string& text, const std::regex& re) {
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}
}  // namespace

TEST_CASE("bench comm prints time, algbw and busbw for every size on 2 ranks") {
  ProcResult r = run_command({cli(), "bench", "comm", "-n", "2", "--max-bytes", "65536", "--iters",
                              "2", "-P", distopt::test::env_path("DISTOPT_PLUGIN_DIR")},
                             {}, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("busbw") != std::string::npos);
  // 4 KiB .. 64 KiB doubling: 5 rows of size, count, time, algbw, busbw.
  std::regex row(R"(\n\s+(4096|8192|16384|32768|65536)\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+)");
  CHECK(count_matches(r.output, row) == 5);
}

TEST_CASE(
    "bench step compares unfused and fused optimizer steps against the copy-bandwidth floor") {
  ProcResult r = run_command({cli(), "bench", "step", "--total", "1", "--tensors", "16", "--iters",
                              "2", "-P", distopt::test::env_path("DISTOPT_PLUGIN_DIR")},
                             {}, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("copy bandwidth") != std::string::npos);
  CHECK(std::regex_search(r.output,
                          std::regex(R"(\nunfused\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+1\.00)")));
  CHECK(std::regex_search(r.output,
                          std::regex(R"(\nfused\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+)")));
}

TEST_CASE("bench with an unknown benchmark name fails with a usage error") {
  ProcResult r = run_command({cli(), "bench", "nosuch"}, {}, std::chrono::seconds(30));
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("nosuch") != std::string::npos);
}
