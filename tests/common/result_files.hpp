// Test helpers for results that forked ranks hand back through files:
// vectors of doubles written raw, text files, the largest elementwise
// difference of two result vectors, temporary directories and a few file
// system helpers. Torch-free.
//
// No std::filesystem here or in any test: PyTorch's libtorch exports its own
// broken copy of it, which a test binary would bind to (tools/check_symbols.sh
// says more). Paths are strings; these helpers use POSIX calls.
#pragma once

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
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

/// `dir`/`what``rank`.bin: where rank `rank` of a forked test writes `what`.
inline std::string rank_file(const std::string& dir, const std::string& what, int rank) {
  return dir + "/" + what + std::to_string(rank) + ".bin";
}

/// max_i |a[i] - b[i]|; infinity when the sizes differ or both are empty, so
/// a missing or truncated result never passes a tolerance check, or
/// when any difference is NaN (a diverged run).
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;  // a diverged run never matches (std::max drops NaN)
    m = std::max(m, d);
  }
  return m;
}

/// rm -rf `path` without following symlinks; a missing path is no error.
/// True when everything is gone.
inline bool remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  auto rm = [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); };
  return ::nftw(path.c_str(), rm, 16, FTW_DEPTH | FTW_PHYS) == 0;
}

/// Whether `path` exists (stat follows symlinks).
inline bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

/// Whether `path` is (a symlink to) a directory.
inline bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// The names in directory `dir` (no "." or ".."), sorted; empty when it
/// cannot be read.
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// Every regular file under `dir` (recursively, symlinks not followed), as
/// full paths, sorted; empty when `dir` cannot be read.
inline std::vector<std::string> files_under(const std::string& dir) {
  static thread_local std::vector<std::string>* found = nullptr;  // nftw has no user pointer
  std::vector<std::string> out;
  found = &out;
  auto add = [](const char* p, const struct stat*, int type, struct FTW*) {
    if (type == FTW_F) found->push_back(p);
    return 0;
  };
  ::nftw(dir.c_str(), add, 16, FTW_PHYS);
  found = nullptr;
  std::sort(out.begin(), out.end());
  return out;
}

/// mkdir -p `path` (mode 0755). Throws std::runtime_error naming the
/// directory that could not be made.
inline void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0755) != 0 && !is_dir(prefix))
      throw std::runtime_error("make_dirs: cannot create " + prefix + ": " + std::strerror(errno));
  }
}

/// Copy file `from` to `to`, which must not exist yet. Throws
/// std::runtime_error naming the file on failure.
inline void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw std::runtime_error("copy_file: cannot read " + from);
  if (path_exists(to)) throw std::runtime_error("copy_file: " + to + " exists");
  std::ofstream out(to, std::ios::binary);
  if (!(out << in.rdbuf()) || !out.flush())
    throw std::runtime_error("copy_file: cannot write " + to);
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
  ~TempDir() { remove_tree(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string operator/(const std::string& name) const { return file(name); }
};

}  // namespace distopt::test
