// `distopt bench comm` and `distopt bench step` run and print their tables
// (smoke-sized: the numbers themselves are benchmarks, not test assertions).
#include <doctest/doctest.h>

#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <utility>

#include "cli_util.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using distopt::test::cli::cli;

TEST_CASE("bench comm prints median time with its min..max, algbw and busbw for every size") {
  ProcResult r = run_command({cli(), "bench", "comm", "-n", "2", "--max-bytes", "65536", "--iters",
                              "3", "-P", distopt::test::env_path("DISTOPT_PLUGIN_DIR")},
                             {}, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("busbw") != std::string::npos);
  // 4 KiB .. 64 KiB doubling: 5 rows of size, count, median, min..max, algbw, busbw.
  std::regex row(
      R"(\n\s+(4096|8192|16384|32768|65536)\s+\d+\s+([0-9.]+)\s+([0-9.]+)\.\.([0-9.]+)\s+[0-9.]+\s+[0-9.]+)");
  int rows = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), row);
       it != std::sregex_iterator(); ++it, ++rows) {
    const double median = std::stod((*it)[2]), lo = std::stod((*it)[3]), hi = std::stod((*it)[4]);
    CHECK(lo <= median + 0.05);  // printed to 0.1 us
    CHECK(median <= hi + 0.05);
  }
  CHECK(rows == 5);
}

TEST_CASE("bench comm's point-to-point ops deliver the data and print a row per size") {
  // exchange: 0 <-> 1 and 2 <-> 3 at once; shift on 3 ranks: 0 -> 1 -> 2 -> 0;
  // send: 0 -> 1 only. A wrong or missing delivery fails the run.
  for (const auto& op_n : {std::make_pair("exchange", "4"), std::make_pair("shift", "3"),
                           std::make_pair("send", "2")}) {
    const std::string op = op_n.first;
    CAPTURE(op);
    ProcResult r =
        run_command({cli(), "bench", "comm", "--op", op_n.first, "-n", op_n.second, "--max-bytes",
                     "65536", "--iters", "3", "-P", distopt::test::env_path("DISTOPT_PLUGIN_DIR")},
                    {}, std::chrono::seconds(120));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("tcp " + op + ", " + op_n.second + " ranks") != std::string::npos);
    std::regex row(
        R"(\n\s+(4096|8192|16384|32768|65536)\s+\d+\s+[0-9.]+\s+[0-9.]+\.\.[0-9.]+\s+[0-9.]+\s+[0-9.]+)");
    CHECK(std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), row),
                        std::sregex_iterator()) == 5);
  }
}

TEST_CASE("bench comm names the valid operations for an unknown --op") {
  ProcResult r = run_command({cli(), "bench", "comm", "--op", "alltoall", "-P",
                              distopt::test::env_path("DISTOPT_PLUGIN_DIR")},
                             {}, std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("unknown --op 'alltoall'") != std::string::npos);
  CHECK(r.output.find("allreduce, reduce_scatter, allgather, broadcast") != std::string::npos);
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
