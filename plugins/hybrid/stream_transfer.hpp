// Transfer for parameters in the memory of a device with streams (CUDA),
// after Megatron-LM's HybridDeviceOptimizer: one side stream per direction.
// Written against c10's device-generic stream and event interface
// (c10::impl::VirtualGuardImpl), so it builds with any libtorch, CPU-only
// ones included; it is chosen only for parameters on such a device.
// It ran on an H200 at world size 1 (offload fractions 0, 0.5 and 1;
// STATUS.md); its ordering is tested with a stand-in device backend
// (tests/hybrid).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <functional>
#include <memory>
#include <string>

#include "transfer.hpp"

namespace distopt::plugins::hybrid {

/// Each submit records an event on the submitting thread's current stream of
/// `device` (so the copies start after the gradients the caller produced
/// there); one worker thread then, in submission order, makes the side
/// stream wait on that event, runs the work with the side stream current
/// (copies with non_blocking = true are queued there) and synchronizes the
/// side stream before completing: a completion means the bytes have landed
/// and the host may read them or the device use them. Work that throws
/// completes with its status and "<component>: <label>: <what>".
class StreamTransfer : public Transfer {
 public:
  /// Throws c10::Error where libtorch has no backend for device.type().
  StreamTransfer(const std::string& component, c10::Device device);
  std::shared_ptr<sdk::Completion> submit(std::function<void()> work, std::string label) override;
  bool non_blocking() const override { return true; }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  c10::Stream side_;
  std::unique_ptr<sdk::SerialWorker> worker_;  // last member: stops first
};

}  // namespace distopt::plugins::hybrid
