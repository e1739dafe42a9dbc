// Path and directory helpers on POSIX calls, in place of std::filesystem.
//
// Why not std::filesystem: PyTorch's libtorch (2.x wheels and archives) links
// the libstdc++ parts newer than its build system's libstdc++ statically and
// exports them (pytorch/pytorch issue 133437). A distopt library that imports
// a std::filesystem symbol binds to libtorch's copy when libtorch is loaded
// first, and that copy crashes (a jump to address 0). Nothing distopt builds
// may import such a symbol; tools/check_symbols.sh checks it.
//
// Paths are plain strings; the path functions are lexical and follow
// std::filesystem::path's POSIX semantics, so behaviour is as it was. Every
// function is thread-safe (no shared state; absolute() reads the cwd).
#pragma once

#include <string>
#include <vector>

namespace distopt::util {

/// True when `p` starts with '/'.
bool is_absolute(const std::string& p);

/// `a / b` as std::filesystem::path joins: `b` when it is absolute or `a` is
/// empty, else `a` + "/" + `b` (no second '/' when `a` ends with one).
std::string join(const std::string& a, const std::string& b);

/// std::filesystem::path::lexically_normal on POSIX: repeated '/' collapsed,
/// "." dropped, "x/.." pairs removed, ".." after the root dropped; "" stays
/// "", and a path that normalises to nothing is ".". A trailing '/' stays.
std::string lexically_normal(const std::string& p);

/// std::filesystem::path::parent_path: "a/b" -> "a", "a" -> "", "/a" -> "/",
/// "a/b/" -> "a/b".
std::string parent_path(const std::string& p);

/// parent_path(p), or "." when that is empty (a bare file name lives in the
/// current directory): the directory to open or fsync for `p`.
std::string dir_of(const std::string& p);

/// The last element (after the last '/'); "" when `p` ends with '/'.
std::string filename(const std::string& p);

/// filename() without extension(); "." and ".." and ".name" are all stem.
std::string stem(const std::string& p);

/// The filename's last ".suffix" (with the dot), or "".
std::string extension(const std::string& p);

/// `p` made absolute against the current directory (not normalised), as
/// std::filesystem::absolute. Returns false and sets errno when the current
/// directory cannot be read or `p` is empty; `out` is then untouched.
bool absolute(const std::string& p, std::string& out);

/// stat(2) succeeds. Throws std::system_error naming `p` on an error other
/// than ENOENT / ENOTDIR (as std::filesystem::exists does).
bool exists(const std::string& p);

/// `p` is (a symlink to) a directory / a regular file. False on any error.
bool is_directory(const std::string& p);
bool is_regular_file(const std::string& p);

/// Both name the same existing file (device and inode). False on any error.
bool same_file(const std::string& a, const std::string& b);

/// mkdir -p. Throws std::system_error naming the path that failed (an
/// existing non-directory included).
void create_directories(const std::string& p);

/// rm -rf without following symlinks; a missing `p` is no error. Returns ""
/// on success, else "<path>: <strerror>" of the first failure (it goes on
/// removing what it can; nothing is thrown).
std::string remove_all(const std::string& p);

/// The names in directory `dir` (no "." or ".."), in readdir order. Throws
/// std::system_error naming `dir` when it cannot be opened or read.
std::vector<std::string> list_dir(const std::string& dir);

}  // namespace distopt::util
