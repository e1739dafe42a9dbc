// hybrid's StreamTransfer (plugins/hybrid/stream_transfer.*) on a stand-in
// device backend: c10's PrivateUse1 device type gets a guard implementation
// whose streams and events only log what is asked of them. No GPU here, so
// this checks the ordering the transfer promises (stream_transfer.hpp), not
// CUDA itself: the event is recorded on the caller's current stream when
// work is submitted; the side stream waits on it before the work runs; the
// work runs with the side stream current; the side stream is synchronized
// before the completion fires; chunks run in submission order; a failure
// names its chunk and does not stop the later ones.
#include "stream_transfer.hpp"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "distopt/sdk/base/host.hpp"
#include "torch_doctest.hpp"

namespace {

constexpr c10::DeviceType kFake = c10::DeviceType::PrivateUse1;
constexpr c10::StreamId kSideStream = 7;  // what the pool hands out

std::mutex g_mu;
std::vector<std::string> g_log;
thread_local c10::StreamId t_current_stream = 0;

void note(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_log.push_back(line);
}

std::vector<std::string> take_log() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::string> out;
  out.swap(g_log);
  return out;
}

// Events are heap ints holding the id of the stream they were recorded on.
struct FakeGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kFake; }
  c10::Device exchangeDevice(c10::Device) const override { return {kFake, 0}; }
  c10::Device getDevice() const override { return {kFake, 0}; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::UNSAFE, d, t_current_stream);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, kSideStream);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::Stream old(c10::Stream::UNSAFE, s.device(), t_current_stream);
    t_current_stream = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (!*event) *event = new int(0);
    *static_cast<int*>(*event) = static_cast<int>(s.id());
    note("record on " + std::to_string(s.id()));
  }
  void block(void* event, const c10::Stream& s) const override {
    note(std::to_string(s.id()) + " waits for an event on " +
         std::to_string(*static_cast<int*>(event)));
  }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<int*>(event);
  }
  void synchronizeStream(const c10::Stream& s) const override {
    note("synchronize " + std::to_string(s.id()));
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FakeGuardImpl);

using distopt::plugins::hybrid::StreamTransfer;

}  // namespace

TEST_CASE("StreamTransfer: event on the caller's stream, side stream waits, runs, drains") {
  take_log();
  const c10::Device dev(kFake, 0);
  StreamTransfer t("hybrid d2h", dev);
  CHECK(t.non_blocking());
  const c10::Stream caller(c10::Stream::UNSAFE, dev, 3);
  c10::StreamGuard on_caller(caller);  // the training thread's current stream
  std::vector<std::shared_ptr<distopt::sdk::Completion>> done;
  for (int i = 0; i < 3; ++i)
    done.push_back(t.submit(
        [i, dev] {
          const c10::Stream s = c10::impl::getDeviceGuardImpl(kFake)->getStream(dev);
          note("work " + std::to_string(i) + " on " + std::to_string(s.id()));
        },
        "chunk " + std::to_string(i)));
  for (auto& d : done) CHECK(d->wait(-1));
  const std::vector<std::string> log = take_log();
  // The records happen in submit (caller thread, in order); the worker's
  // lines for chunk i come as one ordered group.
  std::vector<std::string> records, worker;
  for (const std::string& l : log) (l.rfind("record", 0) == 0 ? records : worker).push_back(l);
  CHECK(records == std::vector<std::string>(3, "record on 3"));
  std::vector<std::string> want;
  for (int i = 0; i < 3; ++i) {
    want.push_back("7 waits for an event on 3");
    want.push_back("work " + std::to_string(i) + " on 7");
    want.push_back("synchronize 7");
  }
  CHECK(worker == want);
  // The caller's current stream is untouched by the worker.
  CHECK(c10::impl::getDeviceGuardImpl(kFake)->getStream(dev).id() == 3);
}

TEST_CASE("StreamTransfer: a chunk that throws fails its completion, later chunks still run") {
  take_log();
  StreamTransfer t("hybrid h2d", c10::Device(kFake, 0));
  auto bad = t.submit([] { throw distopt::sdk::Error(DOPT_ERR_COMM, "copy engine fault"); },
                      "h2d of fc1.weight");
  auto good = t.submit([] { note("work after"); }, "h2d of fc2.weight");
  try {
    bad->wait(-1);
    FAIL("the failed chunk completed");
  } catch (const distopt::sdk::Error& e) {
    CHECK(e.status() == DOPT_ERR_COMM);
    CHECK(std::string(e.what()) == "hybrid h2d: h2d of fc1.weight: copy engine fault");
  }
  CHECK(good->wait(-1));
  const std::vector<std::string> log = take_log();
  CHECK(std::count(log.begin(), log.end(), "work after") == 1);
}

TEST_CASE("StreamTransfer: a device type without a backend is refused at construction") {
  // No XLA backend in this libtorch: VirtualGuardImpl throws.
  CHECK_THROWS_AS(StreamTransfer("hybrid d2h", c10::Device(c10::DeviceType::XLA, 0)), c10::Error);
}
