#include "base/posix_fs.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace distopt::util {

namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Non-empty elements between '/'.
std::vector<std::string> split(const std::string& p) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    if (end > start) out.push_back(p.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

void remove_tree(const std::string& p, std::string& first_err) {
  auto note = [&](const std::string& path) {
    if (first_err.empty()) first_err = path + ": " + std::strerror(errno);
  };
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno != ENOENT) note(p);
    return;
  }
  if (!S_ISDIR(st.st_mode)) {  // files and symlinks (never followed)
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) note(p);
    return;
  }
  std::vector<std::string> names;
  try {
    names = list_dir(p);
  } catch (const std::system_error&) {
    note(p);  // errno still holds the cause
    return;
  }
  for (const auto& n : names) remove_tree(join(p, n), first_err);
  if (::rmdir(p.c_str()) != 0 && errno != ENOENT) note(p);
}

}  // namespace

bool is_absolute(const std::string& p) { return !p.empty() && p[0] == '/'; }

std::string join(const std::string& a, const std::string& b) {
  if (a.empty() || is_absolute(b)) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string lexically_normal(const std::string& p) {
  if (p.empty()) return p;
  const bool abs = is_absolute(p);
  const std::vector<std::string> parts = split(p);
  std::vector<std::string> out;
  bool trailing = p.back() == '/';  // "a/b/" keeps its '/', as std does
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const std::string& e = parts[i];
    if (e == ".") {
      if (last) trailing = true;  // "a/." -> "a/"
      continue;
    }
    if (e == "..") {
      if (!out.empty() && out.back() != "..") {
        out.pop_back();
        if (last) trailing = true;  // "a/b/.." -> "a/"
        continue;
      }
      if (abs) continue;  // "/.." is "/"
    }
    out.push_back(e);
  }
  if (out.empty()) return abs ? "/" : ".";
  std::string s = abs ? "/" : "";
  for (size_t i = 0; i < out.size(); ++i) s += (i ? "/" : "") + out[i];
  if (trailing && out.back() != "..") s += "/";  // no '/' after a final ".."
  return s;
}

std::string parent_path(const std::string& p) {
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return "";
  size_t end = slash;  // drop the filename, then the separators before it
  while (end > 0 && p[end - 1] == '/') --end;
  if (end == 0) return "/";  // "/a": the root
  return p.substr(0, end);
}

std::string dir_of(const std::string& p) {
  std::string d = parent_path(p);
  return d.empty() ? "." : d;
}

std::string filename(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string extension(const std::string& p) {
  const std::string f = filename(p);
  if (f == "." || f == "..") return "";
  const size_t dot = f.rfind('.');
  if (dot == std::string::npos || dot == 0) return "";
  return f.substr(dot);
}

std::string stem(const std::string& p) {
  const std::string f = filename(p);
  return f.substr(0, f.size() - extension(p).size());
}

bool absolute(const std::string& p, std::string& out) {
  if (p.empty()) {
    errno = EINVAL;
    return false;
  }
  if (is_absolute(p)) {
    out = p;
    return true;
  }
  std::vector<char> buf(4096);
  while (::getcwd(buf.data(), buf.size()) == nullptr) {
    if (errno != ERANGE) return false;
    buf.resize(buf.size() * 2);
  }
  out = join(std::string(buf.data()), p);
  return true;
}

bool exists(const std::string& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw_errno(p + ": cannot stat");
}

bool is_directory(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void create_directories(const std::string& p) {
  if (p.empty()) {
    errno = ENOENT;
    throw_errno("cannot create directory ''");
  }
  std::string cur = is_absolute(p) ? "/" : "";
  for (const std::string& e : split(p)) {
    cur = join(cur, e);
    if (::mkdir(cur.c_str(), 0777) == 0) continue;
    const int e_mkdir = errno;
    if (is_directory(cur)) continue;  // there already (or made by a racing process)
    errno = e_mkdir == EEXIST ? ENOTDIR : e_mkdir;
    throw_errno(cur + ": cannot create directory");
  }
}

std::string remove_all(const std::string& p) {
  std::string err;
  remove_tree(p, err);
  return err;
}

std::vector<std::string> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw_errno(dir + ": cannot open directory");
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (!e) break;
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  const int e = errno;
  ::closedir(d);
  if (e != 0) {
    errno = e;
    throw_errno(dir + ": cannot read directory");
  }
  return names;
}

}  // namespace distopt::util
