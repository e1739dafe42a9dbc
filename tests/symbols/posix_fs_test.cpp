// core/src/base/posix_fs, the POSIX stand-ins for std::filesystem: the same
// lexical results (the expected values are libstdc++ 12's std::filesystem::path
// results, checked against it once; a leading "//", which libstdc++ keeps, is
// left out) and file operations; write_atomic to a bare file name syncs "."
//.
#include "base/posix_fs.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "result_files.hpp"
#include "state/atomic_file.hpp"

namespace pfs = distopt::util;

TEST_CASE("lexically_normal as std::filesystem::path::lexically_normal") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},
      {".", "."},
      {"./", "."},
      {"..", ".."},
      {"../", ".."},
      {"/", "/"},
      {"/..", "/"},
      {"/../a", "/a"},
      {"a", "a"},
      {"a/", "a/"},
      {"a/.", "a/"},
      {"./a", "a"},
      {"a/..", "."},
      {"a/../", "."},
      {"a/b/..", "a/"},
      {"a//b", "a/b"},
      {"../a/..", ".."},
      {"../../a", "../../a"},
      {"foo/./bar/..", "foo/"},     // the standard's example
      {"foo/.///bar/../", "foo/"},  // the standard's example
      {"/x/good/../../../nowhere/p", "/nowhere/p"},
      {"/a/b/../../..", "/"},
  };
  for (const auto& [in, out] : cases) {
    CAPTURE(in);
    CHECK(pfs::lexically_normal(in) == out);
  }
}

TEST_CASE("join, parent_path, dir_of, filename, stem, extension, is_absolute") {
  CHECK(pfs::join("a", "b") == "a/b");
  CHECK(pfs::join("a/", "b") == "a/b");
  CHECK(pfs::join("", "b") == "b");
  CHECK(pfs::join("a", "/b") == "/b");
  CHECK(pfs::join("a", "") == "a/");
  CHECK(pfs::parent_path("a/b") == "a");
  CHECK(pfs::parent_path("a") == "");
  CHECK(pfs::parent_path("/a") == "/");
  CHECK(pfs::parent_path("/") == "/");
  CHECK(pfs::parent_path("a/b/") == "a/b");
  CHECK(pfs::parent_path("a//b") == "a");
  CHECK(pfs::dir_of("model.pt") == ".");  // not ""
  CHECK(pfs::dir_of("ck/model.pt") == "ck");
  CHECK(pfs::filename("a/b.so") == "b.so");
  CHECK(pfs::filename("a/") == "");
  CHECK(pfs::stem("/x/libdistopt_tcp.so") == "libdistopt_tcp");
  CHECK(pfs::stem("a.tar.gz") == "a.tar");
  CHECK(pfs::stem(".hidden") == ".hidden");
  CHECK(pfs::stem("..") == "..");
  CHECK(pfs::extension("/x/libdistopt_tcp.so") == ".so");
  CHECK(pfs::extension(".so") == "");
  CHECK(pfs::extension("a.") == ".");
  CHECK(pfs::extension("noext") == "");
  CHECK(pfs::is_absolute("/a"));
  CHECK_FALSE(pfs::is_absolute("a/b"));
  CHECK_FALSE(pfs::is_absolute(""));
}

TEST_CASE("absolute joins the current directory; empty is an error") {
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd) != nullptr);
  std::string out;
  REQUIRE(pfs::absolute("x/y", out));
  CHECK(out == pfs::join(cwd, "x/y"));
  REQUIRE(pfs::absolute("/abs", out));
  CHECK(out == "/abs");
  out = "untouched";
  CHECK_FALSE(pfs::absolute("", out));
  CHECK(out == "untouched");
}

TEST_CASE("create_directories, exists, list_dir, same_file, remove_all on a real tree") {
  distopt::test::TempDir t("distopt_posix_fs");
  const std::string deep = t.path + "/a/b/c";
  pfs::create_directories(deep);
  pfs::create_directories(deep);  // again: no error
  CHECK(pfs::is_directory(deep));
  CHECK(pfs::exists(deep));
  CHECK_FALSE(pfs::exists(t.path + "/missing"));
  CHECK_FALSE(pfs::exists(t.path + "/missing/below"));
  std::ofstream(t.path + "/a/f.so") << "x";
  CHECK(pfs::is_regular_file(t.path + "/a/f.so"));
  CHECK_FALSE(pfs::is_regular_file(t.path + "/a"));
  CHECK_FALSE(pfs::is_directory(t.path + "/a/f.so"));
  // A file in the way is an error naming it.
  CHECK_THROWS_WITH_AS(pfs::create_directories(t.path + "/a/f.so/sub"),
                       doctest::Contains((t.path + "/a/f.so").c_str()), std::system_error);
  auto names = pfs::list_dir(t.path + "/a");
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"b", "f.so"});
  CHECK_THROWS_WITH_AS(pfs::list_dir(t.path + "/missing"),
                       doctest::Contains((t.path + "/missing: cannot open directory").c_str()),
                       std::system_error);

  // Symlinks: same_file sees through them; remove_all removes the link only.
  const std::string outside = t.path + "/outside";
  pfs::create_directories(outside);
  std::ofstream(outside + "/keep.txt") << "keep";
  REQUIRE(::symlink(outside.c_str(), (deep + "/link").c_str()) == 0);
  CHECK(pfs::same_file(outside, deep + "/link"));
  CHECK(pfs::same_file(t.path + "/a/f.so", t.path + "/a/b/../f.so"));
  CHECK_FALSE(pfs::same_file(outside, deep));
  CHECK_FALSE(pfs::same_file(outside, t.path + "/missing"));
  CHECK(pfs::remove_all(t.path + "/a") == "");
  CHECK_FALSE(pfs::exists(t.path + "/a"));
  CHECK(pfs::exists(outside + "/keep.txt"));
  CHECK(pfs::remove_all(t.path + "/missing") == "");  // nothing there: no error

  // A failure is reported, naming the path, and not thrown.
  if (::geteuid() != 0) {  // root may remove anything
    pfs::create_directories(t.path + "/ro/sub");
    REQUIRE(::chmod((t.path + "/ro").c_str(), 0555) == 0);
    const std::string err = pfs::remove_all(t.path + "/ro");
    ::chmod((t.path + "/ro").c_str(), 0755);
    CHECK(err.find(t.path + "/ro/sub: ") == 0);
  }
}

TEST_CASE("write_atomic to a bare file name writes it in the current directory") {
  distopt::test::TempDir t("distopt_posix_fs_cwd");
  char old[4096];
  REQUIRE(::getcwd(old, sizeof old) != nullptr);
  REQUIRE(::chdir(t.path.c_str()) == 0);
  const std::vector<char> bytes = {'o', 'k'};
  std::string err;
  try {
    distopt::checkpoint::write_atomic("model.pt", bytes);
  } catch (const std::exception& e) {
    err = e.what();
  }
  REQUIRE(::chdir(old) == 0);
  CHECK(err == "");
  CHECK(distopt::test::read_text(t.path + "/model.pt") == "ok");
  CHECK(distopt::test::list_dir(t.path) == std::vector<std::string>{"model.pt"});
}
