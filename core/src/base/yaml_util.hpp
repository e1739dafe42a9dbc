// Helpers shared by the config and options parsers: error locations in
// "FILE:LINE:COLUMN: " form (1-based) and strict YAML scalar conversion.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "distopt/error.hpp"

namespace distopt::yaml {

/// node's mark, or `fallback` when node is undefined (a missing key) or has no mark.
inline YAML::Mark mark_of(const YAML::Node& node,
                          const YAML::Mark& fallback = YAML::Mark::null_mark()) {
  if (!node.IsDefined()) return fallback;
  YAML::Mark m = node.Mark();
  return m.is_null() ? fallback : m;
}

/// "FILE:LINE:COLUMN" (1-based), or "FILE" when the mark is null.
inline std::string location(const std::string& file, const YAML::Mark& m) {
  if (m.is_null()) return file;
  return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

[[noreturn]] inline void fail(const std::string& file, const YAML::Mark& m,
                              const std::string& msg) {
  throw ConfigError(location(file, m) + ": " + msg);
}

/// `v` as a person writes it: "0.9", "1e-08", "25" (%g, up to 6 digits).
inline std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

/// How a node reads in an error message: 'text', a map, a list, null.
inline std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return "'" + node.Scalar() + "'";
}

/// A plain (unquoted) scalar: YAML gives quoted scalars the "!" tag, and a
/// quoted "5" is a string, not a number.
inline bool is_plain_scalar(const YAML::Node& node) {
  return node.IsDefined() && node.IsScalar() && node.Tag() != "!";
}

inline std::optional<bool> to_bool(const YAML::Node& node) {
  bool v = false;
  if (is_plain_scalar(node) && YAML::convert<bool>::decode(node, v)) return v;
  return std::nullopt;
}

/// A decimal integer ("-12", "+3"); not yaml-cpp's stream parse, which would
/// read "010" as octal 8.
inline std::optional<int64_t> to_int(const YAML::Node& node) {
  if (!is_plain_scalar(node)) return std::nullopt;
  const std::string& s = node.Scalar();
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return std::nullopt;
  for (size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return std::nullopt;
  errno = 0;
  long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(v);
}

/// A number (an integer scalar is accepted); NaN is refused.
inline std::optional<double> to_double(const YAML::Node& node) {
  double v = 0;
  if (is_plain_scalar(node) && YAML::convert<double>::decode(node, v) && !std::isnan(v)) return v;
  return std::nullopt;
}

inline std::optional<std::string> to_string(const YAML::Node& node) {
  if (node.IsDefined() && node.IsScalar()) return node.Scalar();
  return std::nullopt;
}

/// Levenshtein distance, for "did you mean" hints on unknown keys.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    prev.swap(cur);
  }
  return prev[b.size()];
}

/// The entry of `valid` a person most likely meant by `word`, or "": the
/// closest within edit distance 2 ("zer0" -> "zero"), else one that starts
/// with `word` or that `word` starts with, at least 4 characters shared
/// ("bucket_cap" -> "bucket_cap_mb").
inline std::string closest_match(const std::string& word, const std::vector<std::string>& valid) {
  const std::string* best = nullptr;
  size_t best_d = 3;  // suggest only close matches
  for (const auto& v : valid) {
    size_t d = edit_distance(word, v);
    if (d < best_d) best_d = d, best = &v;
  }
  if (best) return *best;
  for (const auto& v : valid) {
    const size_t n = std::min(word.size(), v.size());
    if (n >= 4 && word.compare(0, n, v, 0, n) == 0) return v;
  }
  return "";
}

/// "unknown key 'K' in SECTION; valid keys: a, b (did you mean 'a'?)"
inline std::string unknown_key_message(const std::string& key, const std::string& section,
                                       const std::vector<std::string>& valid) {
  std::string msg = "unknown key '" + key + "' in " + section +
                    "; valid keys: " + (valid.empty() ? std::string("(none)") : join(valid));
  if (const std::string best = closest_match(key, valid); !best.empty())
    msg += " (did you mean '" + best + "'?)";
  return msg;
}

}  // namespace distopt::yaml
