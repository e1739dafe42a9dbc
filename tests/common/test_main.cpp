// doctest's main, plus the skip convention of skip.hpp: a run in which no
// test case failed but some were skipped exits with kSkipReturnCode.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "skip.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases, ...
  const auto& skipped = distopt::test::skipped_test_cases();
  if (rc != 0 || skipped.empty()) return rc;
  std::printf("%zu test case(s) skipped (exit code %d):\n", skipped.size(),
              distopt::test::kSkipReturnCode);
  for (const auto& why : skipped) std::printf("  %s\n", why.c_str());
  return distopt::test::kSkipReturnCode;
}
