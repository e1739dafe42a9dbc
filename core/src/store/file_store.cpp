// file:// rendezvous store.
#include "store/file_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "distopt/error.hpp"

namespace distopt::store {
namespace {

void mkdirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (!cur.empty() && mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST)
      throw RendezvousError("file store: cannot create directory '" + cur +
                            "': " + std::strerror(errno));
  }
}

void write_atomic(const std::string& path, const void* data, size_t n) {
  static std::atomic<unsigned> seq{0};
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(seq++);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw RendezvousError("file store: cannot write '" + tmp + "': " + std::strerror(errno));
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = errno;
      close(fd);
      unlink(tmp.c_str());
      throw RendezvousError("file store: write to '" + tmp + "' failed: " + std::strerror(e));
    }
    c += k;
    n -= static_cast<size_t>(k);
  }
  fsync(fd);
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    unlink(tmp.c_str());
    throw RendezvousError("file store: rename to '" + path + "' failed: " + std::strerror(e));
  }
}

}  // namespace

FileStore::FileStore(const std::string& dir, std::chrono::milliseconds timeout)
    : dir_(dir), timeout_(timeout) {
  if (dir_.empty()) throw RendezvousError("file store: empty directory in file:// URL");
  mkdirs(dir_);
}

// Keys become file names: letters, digits, '-', '_' and '.' are kept, every
// other byte (notably '/') is written as %XX, so keys never escape the directory.
std::string FileStore::path_of(const std::string& key) const {
  static const char* hex = "0123456789ABCDEF";
  std::string name = "k_";
  for (unsigned char c : key) {
    if (isalnum(c) || c == '-' || c == '_' || (c == '.' && !name.empty())) {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += hex[c >> 4];
      name += hex[c & 15];
    }
  }
  return dir_ + "/" + name;
}

bool FileStore::read_file(const std::string& path, std::vector<uint8_t>& out) const {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

void FileStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  write_atomic(path_of(key), value.data(), value.size());
}

std::vector<uint8_t> FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<uint8_t> v;
  std::string path = path_of(key);
  while (!read_file(path, v)) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw RendezvousError("rendezvous store (file://" + dir_ + "): timed out after " +
                            std::to_string(timeout.count()) + " ms waiting for key '" + key + "'");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return v;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::string lock_path = dir_ + "/.lock";
  int lfd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lfd < 0)
    throw RendezvousError("file store: cannot open '" + lock_path + "': " + std::strerror(errno));
  while (flock(lfd, LOCK_EX) != 0 && errno == EINTR) {
  }
  int64_t cur = 0;
  std::vector<uint8_t> v;
  std::string path = path_of(key);
  try {
    if (read_file(path, v) && !v.empty()) cur = std::stoll(std::string(v.begin(), v.end()));
    cur += delta;
    std::string s = std::to_string(cur);
    write_atomic(path, s.data(), s.size());
  } catch (const RendezvousError&) {
    close(lfd);
    throw;
  } catch (const std::exception&) {
    close(lfd);
    throw RendezvousError("file store: key '" + key + "' does not hold a counter");
  }
  close(lfd);  // releases the lock
  return cur;
}

bool FileStore::check(const std::string& key) { return access(path_of(key).c_str(), F_OK) == 0; }

}  // namespace distopt::store
