// A test plugin: reducer `hang_test`, which averages like `mean` for two
// buckets and then never returns from its third reduce (a deadlock in a
// plugin's own code, no collective in flight), on every rank. The
// watchdog test (tests/cli/newcomer_test.cpp) holds that the host names
// the rank, the component and the operation instead of hanging silently.
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "distopt/sdk/sdk.hpp"

namespace {

class Passed : public distopt::sdk::Request {
 public:
  explicit Passed(distopt::sdk::CommHandle h) : h_(std::move(h)) {}
  bool test() override { return h_.test(); }
  bool wait(int64_t timeout_ms) override {
    h_.wait(timeout_ms);
    return true;
  }

 private:
  distopt::sdk::CommHandle h_;
};

class HangReducer : public distopt::sdk::Reducer {
 public:
  HangReducer(const dopt_create_args&, dopt_comm_ref comm, const dopt_bucket*, size_t)
      : comm_(comm) {}
  std::unique_ptr<distopt::sdk::Request> reduce(const dopt_bucket& bucket) override {
    if (++calls_ >= 3)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // never returns
    bytes_ += distopt::sdk::dl_nbytes(*bucket.flat);  // (not a ring's count: any > 0 will do)
    return std::make_unique<Passed>(comm_.allreduce(*bucket.flat, *bucket.flat, DOPT_REDUCE_AVG));
  }
  uint64_t bytes_sent() const override { return bytes_.load(); }
  void save_state(distopt::sdk::StateWriter&) override {}
  void load_state(const distopt::sdk::StateReader&) override {}

 private:
  distopt::sdk::CommView comm_;
  std::atomic<int> calls_{0};
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace

DOPT_PLUGIN("hang_test", "1.0.0",
            DOPT_COMPONENT(HangReducer, "hang_test", "1.0.0",
                           "test only: never returns from its third reduce", nullptr))
