// Helpers of the tests that run `distopt train` and read its checkpoints
// back (tests/checkpoint, tests/elastic). Include after doctest (and
// libtorch's headers: torch_doctest.hpp).
#pragma once

#include <torch/serialize.h>

#include <chrono>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "result_files.hpp"

namespace distopt::test::cli {

/// `distopt train CFG ARGS...` with `env` ("NAME=VALUE") added to the
/// environment; at most 240 s.
inline ProcResult train(const std::string& cfg, std::vector<std::string> args,
                        std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {cli(), "train", cfg};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, env, std::chrono::seconds(240));
}

/// `distopt checkpoint consolidate DIR OUT`, then OUT read back as Python's
/// torch.load would (torch::pickle_load). Fails the test when the command does.
inline c10::impl::GenericDict consolidated(const std::string& dir, const std::string& out) {
  ProcResult r =
      run_command({cli(), "checkpoint", "consolidate", dir, out}, {}, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string bytes = read_text(out);
  return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
}

/// Every tensor of section `s` bitwise equal in `a` and `b`: the same keys,
/// at least one; nested sections are compared the same way.
inline void check_equal_section(const c10::impl::GenericDict& a, const c10::impl::GenericDict& b,
                                const std::string& s) {
  auto da = a.at(s).toGenericDict(), db = b.at(s).toGenericDict();
  REQUIRE(da.size() == db.size());
  REQUIRE(da.size() > 0);
  for (const auto& kv : da) {
    const std::string k = kv.key().toStringRef();
    INFO(s << "/" << k);
    REQUIRE(db.contains(k));
    if (kv.value().isTensor())
      CHECK(torch::equal(kv.value().toTensor(), db.at(k).toTensor()));
    else if (kv.value().isGenericDict())
      check_equal_section(da, db, k);
  }
}

}  // namespace distopt::test::cli
