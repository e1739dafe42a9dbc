// Test cases that cannot run here (a data set that is not installed) end
// early and say so; the test binary then exits with kSkipReturnCode, which
// ctest reports as "Skipped" (SKIP_RETURN_CODE, set for every test by
// distopt_add_test) instead of "Passed". A failure anywhere still fails.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace distopt::test {

/// The exit code of a test binary in which a test case was skipped and none
/// failed (automake's and netns_test's convention).
inline constexpr int kSkipReturnCode = 77;

/// Why each skipped test case of this process did not run, in order.
/// Not thread-safe: test cases run on the main thread.
inline std::vector<std::string>& skipped_test_cases() {
  static std::vector<std::string> reasons;
  return reasons;
}

}  // namespace distopt::test

/// Ends the current TEST_CASE as skipped, with `reason` (a string) printed.
#define DISTOPT_SKIP_TEST_CASE(reason)                                     \
  do {                                                                     \
    const std::string distopt_skip_reason_(reason);                        \
    MESSAGE("skipped: " << distopt_skip_reason_);                          \
    ::distopt::test::skipped_test_cases().push_back(distopt_skip_reason_); \
    return;                                                                \
  } while (0)
