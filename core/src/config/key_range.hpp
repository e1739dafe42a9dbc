// The parser's reading of a key's row in the key tables (key_schema.cpp):
// its type, its range as numbers or its choices. The row is the one place a
// host key's type, range and help are written (its default is the public
// struct's member initializer, which the row prints), so what the parser
// refuses and what `distopt config reference` says cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distopt/key_schema.hpp"

namespace distopt::config {

/// A row's range: for "int" and "double" rows an interval ("[1, 1048576]",
/// "(0, 1e9]", "[0, inf)"; ints' open ends already moved inwards), for a
/// "string" row with a range the names it lists ('|'-separated; "fp32" alone
/// is one choice). Callers ask for choices only of the rows that are choices.
struct KeyRange {
  bool numeric = false;
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  int64_t int_lo = 0, int_hi = 0;    ///< ints: inclusive bounds (inf = INT64_MAX)
  std::vector<std::string> choices;  ///< strings: "a|b|c" -> {a, b, c}; empty: any string
};

/// The row of `key` in section `section` (config_section's path); throws
/// std::logic_error when there is none (a programming error).
const KeySpec& config_key(const std::string& section, const std::string& key);

/// `spec`'s range read as above; throws std::logic_error for a numeric row
/// whose range is not an interval (a programming error, caught by the tests
/// that read every row).
KeyRange key_range(const KeySpec& spec);

}  // namespace distopt::config
