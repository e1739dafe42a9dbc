// Test helpers for results that forked ranks hand back through files:
// vectors of doubles written raw, text files, the largest elementwise
// difference of two result vectors, and temporary directories. Torch-free.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace distopt::test {

/// Write `v` to `path` as raw doubles (native byte order, no header).
inline void write_doubles(const std::string& path, const std::vector<double>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()),
             static_cast<std::streamsize>(v.size() * sizeof(double)));
}

/// Every double in `path` (empty when it is missing).
inline std::vector<double> read_doubles(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<double> v;
  double d;
  while (f.read(reinterpret_cast<char*>(&d), sizeof d)) v.push_back(d);
  return v;
}

/// The whole text of `path` (empty when it is missing).
inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// max_i |a[i] - b[i]|; infinity when the sizes differ or both are empty, so
/// a missing or truncated result never passes a tolerance check.
/// `dir`/`what``rank`.bin: where rank `rank` of a forked test writes `what`.
inline std::string rank_file(const std::string& dir, const std::string& what, int rank) {
  return dir + "/" + what + std::to_string(rank) + ".bin";
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

/// A fresh directory /tmp/<prefix>_XXXXXX, left in place; throws on failure.
inline std::string make_temp_dir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

/// A fresh directory /tmp/<prefix>_XXXXXX, removed with its contents at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix) : path(make_temp_dir(prefix)) {}
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string operator/(const std::string& name) const { return file(name); }
};

}  // namespace distopt::test
