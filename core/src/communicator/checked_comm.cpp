#include "communicator/checked_comm.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "base/services.hpp"
#include "communicator/fingerprint.hpp"
#include "communicator/forwarding_comm.hpp"
#include "communicator/mismatch_detector.hpp"
#include "distopt/sdk/base/traffic.hpp"

namespace distopt::comm_check {
namespace {

enum Kind { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kBarrier, kSplit };
const char* kKindNames[] = {"allreduce", "reduce_scatter", "allgather",
                            "broadcast", "barrier",        "split"};

/// Replace the plugin's error detail by the detector's account, if it has
/// one; waits up to `patience` for the other ranks' posts.
void explain(MismatchDetector& detector, const Fingerprint& fp,
             std::chrono::milliseconds patience) {
  const std::string why = detector.explain_failure(fp, patience);
  if (why.empty()) return;
  const std::string detail = take_last_error();
  set_last_error(why + " [" + detail + "]");
}

/// How long a failed collective waits for the other ranks' posts: a peer in
/// another collective posts after one interval; a dead peer never does, so
/// the wait is capped (launchers give survivors kFailurePatienceCap + 1 s).
std::chrono::milliseconds failure_patience(std::chrono::milliseconds interval) {
  return std::min(interval, std::chrono::milliseconds(kFailurePatienceCapMs));
}

/// A collective's request: waits in slices, asking the detector on a stall.
class CheckedRequest final : public comm_wrap::ForwardedRequest {
 public:
  CheckedRequest(std::shared_ptr<MismatchDetector> d, std::chrono::milliseconds stall_after,
                 std::chrono::milliseconds patience, Fingerprint fp)
      : detector_(std::move(d)),
        stall_after_(stall_after),
        patience_(patience.count() >= 0 ? patience : failure_patience(stall_after)),
        fp_(std::move(fp)) {}

  dopt_status wait(int64_t timeout_ms) override {
    const auto start = std::chrono::steady_clock::now();
    bool stalled = false;
    for (;;) {
      int64_t slice = stall_after_.count();
      const int64_t spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
      if (timeout_ms >= 0) slice = std::max<int64_t>(0, std::min(slice, timeout_ms - spent));
      dopt_status st = vt->wait(inner, slice);
      int32_t done = 1;
      if (st == DOPT_ERR_TIMEOUT) {
        take_last_error();  // "not complete after waiting": ours to decide
        const dopt_status t = vt->test(inner, &done);
        if (done) st = t;
      }
      if (done) {
        if (st < 0)
          explain(*detector_, fp_, patience_);  // keeps this rank's post
        else if (stalled)
          detector_->on_wait_done();
        return st;
      }
      if (timeout_ms >= 0 && spent + slice >= timeout_ms) {
        set_last_error(fp_.describe() + ": not complete after waiting " +
                       std::to_string(timeout_ms) + " ms");
        return DOPT_ERR_TIMEOUT;
      }
      stalled = true;
      const std::string mismatch = detector_->on_stall(fp_);
      if (!mismatch.empty()) {
        set_last_error(mismatch);
        return DOPT_ERR_COMM;
      }
    }
  }

  dopt_status test(int32_t* done) override {
    const dopt_status st = vt->test(inner, done);
    if (st < 0) explain(*detector_, fp_, std::chrono::milliseconds(0));  // test() does not wait
    return st;
  }

 private:
  std::shared_ptr<MismatchDetector> detector_;
  std::chrono::milliseconds stall_after_, patience_;
  Fingerprint fp_;
};

class CheckedComm final : public comm_wrap::ForwardingComm {
 public:
  CheckedComm(dopt_comm_ref inner, Settings settings)
      : ForwardingComm(inner), settings_(std::move(settings)) {
    detector_ = std::make_shared<MismatchDetector>(
        settings_.store, settings_.prefix, inner.vt->rank(inner.comm),
        inner.vt->world_size(inner.comm), settings_.comm_name);
  }

  // Collectives are fingerprinted in issue order; send/recv are not checked.
  std::unique_ptr<comm_wrap::ForwardedRequest> prepare(const comm_wrap::Issue& is) override {
    using comm_wrap::OpKind;
    Kind kind;
    switch (is.kind) {
      case OpKind::kAllreduce:
        kind = kAllreduce;
        break;
      case OpKind::kReduceScatter:
        kind = kReduceScatter;
        break;
      case OpKind::kAllgather:
        kind = kAllgather;
        break;
      case OpKind::kBroadcast:
        kind = kBroadcast;
        break;
      case OpKind::kBarrier:
        kind = kBarrier;
        break;
      default:
        return std::make_unique<comm_wrap::ForwardedRequest>();
    }
    return std::make_unique<CheckedRequest>(detector_, settings_.stall_after,
                                            settings_.failure_patience,
                                            next_fingerprint(kind, is.a, is.root, is.op));
  }

  void before_split() override {
    next_fingerprint(kSplit, nullptr, -1, -1);  // blocking: counted, never waited on
  }

  dopt_comm_ref wrap_child(dopt_comm_ref child, int32_t color) override {
    Settings s = settings_;
    s.prefix += "/split" + std::to_string(++splits_) + "." + std::to_string(color);
    return wrap(child, std::move(s));
  }

  void before_destroy() override {
    Fingerprint last;
    uint64_t issued_count = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      issued_count = seq_;
      last = last_;
    }
    detector_->on_leave(issued_count, last);
  }

  std::string no_streams_why() const override {
    return "communicator '" + settings_.comm_name +
           "' has no device streams (set_stream is ABI 1.4)";
  }

 private:
  Fingerprint next_fingerprint(Kind kind, const DLTensor* t, int32_t root, int32_t op) {
    Fingerprint f;
    std::lock_guard<std::mutex> lk(mu_);
    f.seq = ++seq_;
    f.kind_seq = ++kind_seq_[kind];
    f.kind = kKindNames[kind];
    f.count = t ? static_cast<int64_t>(sdk::dl_numel(*t)) : 0;
    if (t) f.dtype = t->dtype;
    f.root = root;
    f.op = op;
    last_ = f;
    return f;
  }

  Settings settings_;
  std::shared_ptr<MismatchDetector> detector_;
  std::mutex mu_;  // sequence counters: collectives may be issued from several threads
  uint64_t seq_ = 0;
  uint64_t kind_seq_[6] = {0, 0, 0, 0, 0, 0};
  int splits_ = 0;
  Fingerprint last_;  // the latest collective issued
};

}  // namespace

dopt_comm_ref wrap(dopt_comm_ref inner, Settings settings) {
  return (new CheckedComm(inner, std::move(settings)))->ref();
}

}  // namespace distopt::comm_check
