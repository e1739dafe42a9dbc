// How the collective-mismatch detector reads the ranks' posts, on an
// in-memory store (no processes, deterministic): a rank that left before a
// peer's collective is a mismatch (it issued fewer), unless one of its own
// collectives failed first. Then it stopped in the failure's cascade (a cut
// link: a ring neighbour can already be one collective ahead), which
// netns_test once saw reported as a mismatch.
#include "communicator/mismatch_detector.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distopt/error.hpp"
#include "distopt/store.hpp"

namespace {

using distopt::comm_check::Fingerprint;
using distopt::comm_check::MismatchDetector;

class MemoryStore final : public distopt::Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lk(mu_);
    kv_[key] = value;
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = kv_.find(key);
    if (it == kv_.end()) throw distopt::RendezvousError("no key " + key);
    return it->second;
  }
  int64_t add(const std::string&, int64_t delta) override { return delta; }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu_);
    return kv_.count(key) > 0;
  }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<uint8_t>> kv_;
};

/// The `seq`-th collective, an allreduce of `count` float32 (sum).
Fingerprint allreduce(uint64_t seq, int64_t count = 1000) {
  Fingerprint f;
  f.seq = seq;
  f.kind = "allreduce";
  f.kind_seq = seq;
  f.count = count;
  f.dtype = DLDataType{kDLFloat, 32, 1};
  f.op = DOPT_REDUCE_SUM;
  return f;
}

struct TwoRanks {
  std::shared_ptr<distopt::Store> store = std::make_shared<MemoryStore>();
  MismatchDetector rank0{store, "c", 0, 2, "tcp"};
  MismatchDetector rank1{store, "c", 1, 2, "tcp"};
};

const std::chrono::milliseconds kNoPatience{0};

}  // namespace

TEST_CASE("a rank that left after fewer collectives is a mismatch") {
  TwoRanks t;
  t.rank1.on_leave(2, allreduce(2));
  const std::string why = t.rank0.explain_failure(allreduce(3), kNoPatience);
  INFO(why);
  CHECK(why.find("collective mismatch on communicator tcp") != std::string::npos);
  CHECK(why.find("rank 1: left the communicator after 2 collective(s)") != std::string::npos);
}

TEST_CASE("a rank that left after a failure of its own is not a mismatch") {
  TwoRanks t;
  // Rank 1's allreduce #2 failed (a peer cut off), and rank 1 left; rank 0
  // had moved on to #3, whose failure follows from the same fault.
  CHECK(t.rank1.explain_failure(allreduce(2), kNoPatience).empty());
  t.rank1.on_leave(2, allreduce(2));
  CHECK(t.rank0.explain_failure(allreduce(3), kNoPatience).empty());
}

TEST_CASE("a failed rank's last collective of another shape at our position is a mismatch") {
  TwoRanks t;
  t.rank1.explain_failure(allreduce(3, 999), kNoPatience);
  t.rank1.on_leave(3, allreduce(3, 999));
  const std::string why = t.rank0.explain_failure(allreduce(3), kNoPatience);
  INFO(why);
  CHECK(why.find("collective mismatch") != std::string::npos);
  CHECK(why.find("rank 1: failed and left the communicator after 3 collective(s)") !=
        std::string::npos);
}
