#include "state/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/posix_fs.hpp"
#include "distopt/error.hpp"

namespace distopt::checkpoint {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw CheckpointError(path + ": " + what + ": " + std::strerror(errno));
}

std::string temp_name(const std::string& path) {
  std::random_device rd;
  return path + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000);
}

}  // namespace

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory", dir);
  if (::fsync(fd) != 0 && errno != EINVAL) {  // EINVAL: the filesystem cannot sync dirs
    ::close(fd);
    fail("fsync of the directory failed", dir);
  }
  ::close(fd);
}

void write_atomic(const std::string& path, const std::vector<char>& bytes, bool die_halfway) {
  const std::string tmp = temp_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", tmp);
  size_t limit = die_halfway ? bytes.size() / 2 : bytes.size();
  size_t done = 0;
  while (done < limit) {
    ssize_t n = ::write(fd, bytes.data() + done, limit - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      fail("write failed", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (die_halfway) ::_exit(137);
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = e;
    fail("fsync failed", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail("rename of " + tmp + " failed", path);
  }
  sync_dir(util::dir_of(path));  // a bare name ("model.pt") lives in "."
}

std::vector<char> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat", path);
  }
  std::vector<char> out(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      errno = e;
      fail("read failed", path);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

uint32_t crc32_of(const std::vector<char>& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {  // zlib takes uInt lengths
    uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = ::crc32(crc, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace distopt::checkpoint
