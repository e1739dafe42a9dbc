// The watchdog over calls into components (see distopt/watchdog.hpp).
#include "distopt/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <iomanip>
#include <list>
#include <mutex>
#include <sstream>
#include <thread>

namespace distopt {

struct WatchdogScope::Entry {
  const char* kind;
  const std::string* name;
  const char* op;
  int64_t detail;
  std::thread::id thread;
  std::chrono::steady_clock::time_point start;
  uint64_t order;  // opening order: nesting within a thread
};

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::list<WatchdogScope::Entry> open;  // list: entries do not move
  uint64_t next_order = 0;
  std::atomic<double> limit_s{0};
  std::atomic<int> rank{0};
  bool thread_started = false;
};

// Never destroyed: the watchdog's thread may outlive static destruction.
State& state() {
  static State* s = new State;
  return *s;
}

std::string describe(const WatchdogScope::Entry& e, Clock::time_point now) {
  std::ostringstream os;
  os << e.kind << " '" << *e.name << "' in " << e.op;
  if (e.detail >= 0) os << " " << e.detail;
  os << " for " << std::fixed << std::setprecision(1)
     << std::chrono::duration<double>(now - e.start).count() << " s";
  return os.str();
}

// The report on the first overdue scope, then the end of the process.
[[noreturn]] void end_rank(State& s, const WatchdogScope::Entry& late, Clock::time_point now) {
  std::ostringstream os;
  os << "distopt: rank " << s.rank.load() << ": watchdog: " << describe(late, now)
     << ", past world.watchdog_s = " << std::defaultfloat << s.limit_s.load()
     << " s; a component that does not return cannot be interrupted, so this rank ends (exit "
     << kWatchdogExitCode << ") and its launcher ends the job.";
  // The stuck thread's nesting, outermost first.
  std::list<const WatchdogScope::Entry*> chain;
  for (const auto& e : s.open)
    if (e.thread == late.thread) chain.push_back(&e);
  chain.sort([](auto* a, auto* b) { return a->order < b->order; });
  if (chain.size() > 1) {
    os << " The stuck thread is in:";
    for (const auto* e : chain) os << "\n  " << describe(*e, now);
  }
  os << "\n";
  const std::string text = os.str();
  // Straight to the descriptor: the logger's lock may be held by the stuck thread.
  const ssize_t ignored = ::write(2, text.data(), text.size());
  (void)ignored;
  _exit(kWatchdogExitCode);
}

void watch(State& s) {
  std::unique_lock<std::mutex> lk(s.mu);
  for (;;) {
    const double limit = s.limit_s.load();
    const auto tick = std::chrono::milliseconds(
        limit <= 0 ? 1000 : std::clamp<int64_t>(static_cast<int64_t>(limit * 250), 10, 1000));
    s.cv.wait_for(lk, tick);
    if (limit <= 0) continue;
    const auto now = Clock::now();
    const auto max_age = std::chrono::duration<double>(limit);
    for (const auto& e : s.open)
      if (now - e.start > max_age) end_rank(s, e, now);
  }
}

}  // namespace

void set_watchdog(double seconds, int rank) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.limit_s = seconds > 0 ? seconds : 0;
  s.rank = rank;
  if (seconds > 0 && !s.thread_started) {
    s.thread_started = true;
    std::thread([&s] { watch(s); }).detach();
  }
  s.cv.notify_all();
}

double watchdog_seconds() { return state().limit_s.load(); }

WatchdogScope::WatchdogScope(const char* kind, const std::string& name, const char* op,
                             int64_t detail) {
  State& s = state();
  if (s.limit_s.load(std::memory_order_relaxed) <= 0) return;
  std::lock_guard<std::mutex> lk(s.mu);
  s.open.push_back(
      {kind, &name, op, detail, std::this_thread::get_id(), Clock::now(), s.next_order++});
  entry_ = &s.open.back();
}

WatchdogScope::~WatchdogScope() {
  if (!entry_) return;
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  for (auto it = s.open.begin(); it != s.open.end(); ++it)
    if (&*it == entry_) {
      s.open.erase(it);
      break;
    }
}

}  // namespace distopt
