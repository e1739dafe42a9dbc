#include "shm_segment.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <stdexcept>

namespace distopt::plugins::tcp {
namespace {

std::string sys_error(const std::string& what, const std::string& name) {
  return what + " '" + name + "': " + std::strerror(errno);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The futex word is a std::atomic<uint32_t> in shared memory: lock-free, so
// its object representation is the plain 32-bit word the kernel compares.
// Non-private futexes: the waiters are in other processes.
int futex_wait(std::atomic<uint32_t>* w, uint32_t expect, long ns) {
  timespec ts{0, ns};
  return static_cast<int>(
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, expect, &ts, nullptr, 0));
}
void futex_wake_all(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    base_ = o.base_;
    bytes_ = o.bytes_;
    name_ = std::move(o.name_);
    owner_linked_ = o.owner_linked_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.owner_linked_ = false;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
}

ShmSegment ShmSegment::create(size_t bytes) {
  // Unique per process and call; O_EXCL guards against a stale name.
  static std::atomic<uint64_t> seq{0};
  std::random_device rd;
  ShmSegment s;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    s.name_ = "/distopt-" + std::to_string(getpid()) + "-" + std::to_string(seq.fetch_add(1)) +
              "-" + std::to_string(rd() & 0xffffff);
    fd = shm_open(s.name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && (errno != EEXIST || attempt > 8))
      throw std::runtime_error(sys_error("shm_open", s.name_));
  }
  s.owner_linked_ = true;  // from here on the destructor unlinks on failure
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::string why = sys_error("ftruncate", s.name_);
    close(fd);
    throw std::runtime_error(why);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw std::runtime_error(sys_error("mmap", s.name_));
  s.base_ = p;
  s.bytes_ = bytes;
  new (p) ShmHeader{};  // the counters start at 0 (the pages are zero too)
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(sys_error("shm_open", name));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    throw std::runtime_error("shared-memory segment '" + name + "' has an unexpected size");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw std::runtime_error(sys_error("mmap", name));
  ShmSegment s;
  s.base_ = p;
  s.bytes_ = bytes;
  s.name_ = name;
  return s;
}

void ShmSegment::unlink() {
  if (!owner_linked_) return;
  shm_unlink(name_.c_str());
  owner_linked_ = false;
}

namespace {
// "mnt:[4026531841]", or "" where /proc does not say.
std::string namespace_id(const char* link) {
  char ns[128] = {};
  ssize_t k = readlink(link, ns, sizeof ns - 1);
  return k > 0 ? std::string(ns, static_cast<size_t>(k)) : std::string();
}
}  // namespace

std::string shm_host_id() {
  std::string id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, id);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // The network namespace too: ranks in different ones are different hosts
  // (containers, pods, the netns test), even where they share /dev/shm.
  return id + "|" + host + "|" + namespace_id("/proc/self/ns/mnt") + "|" +
         namespace_id("/proc/self/ns/net");
}

void shm_publish(ShmHeader* h, std::atomic<uint64_t>& counter, uint64_t value) {
  counter.store(value, std::memory_order_release);
  // seq_cst bump + waiters check pair with the waiter's register-then-recheck:
  // either it sees the new value or we see it registered and wake it.
  h->futex.fetch_add(1, std::memory_order_seq_cst);
  if (h->waiters.load(std::memory_order_seq_cst) > 0) futex_wake_all(&h->futex);
}

dopt_status shm_wait(ShmHeader* h, const std::atomic<uint64_t>& counter, uint64_t value,
                     const ShmWaitCtx& ctx, const std::atomic<bool>* peer_left) {
  // Brief spin: on an idle core the peer is usually microseconds away.
  for (int i = 0; i < 256; ++i) {
    if (counter.load(std::memory_order_acquire) >= value) return DOPT_OK;
    cpu_relax();
  }
  // Then give the core away: with more ranks than cores the peer we wait for
  // may need this very core. A few yields, then sleep on the futex.
  for (int i = 0;; ++i) {
    if (counter.load(std::memory_order_acquire) >= value) return DOPT_OK;
    if (ctx.abort && ctx.abort->load(std::memory_order_acquire)) return DOPT_ERR_ABORTED;
    if (peer_left && peer_left->load(std::memory_order_acquire) &&
        counter.load(std::memory_order_acquire) < value)
      return DOPT_ERR_COMM;
    if (Clock::now() >= ctx.deadline) return DOPT_ERR_TIMEOUT;
    if (i < 16) {
      sched_yield();
      continue;
    }
    uint32_t seen = h->futex.load(std::memory_order_seq_cst);
    h->waiters.fetch_add(1, std::memory_order_seq_cst);
    if (counter.load(std::memory_order_seq_cst) < value)
      futex_wait(&h->futex, seen, 2'000'000);  // 2 ms slices: abort and deadline stay prompt
    h->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace distopt::plugins::tcp
