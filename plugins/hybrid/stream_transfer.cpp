#include "stream_transfer.hpp"

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <utility>

namespace distopt::plugins::hybrid {

StreamTransfer::StreamTransfer(const std::string& component, c10::Device device)
    : device_(device),
      guard_(device.type()),
      side_(guard_.getStreamFromGlobalPool(device)),
      worker_(std::make_unique<sdk::SerialWorker>(component)) {}

std::shared_ptr<sdk::Completion> StreamTransfer::submit(std::function<void()> work,
                                                        std::string label) {
  // Recorded here, on the caller's thread: its current stream is the one
  // that produced what the work reads.
  auto ready = std::make_shared<c10::Event>(device_.type());
  ready->record(guard_.getStream(device_));
  auto done = std::make_shared<sdk::Completion>(label);
  worker_->submit(
      [this, ready, work = std::move(work)] {
        c10::DeviceGuard on_device(device_);
        ready->block(side_);
        c10::StreamGuard on_side(side_);
        work();
        side_.synchronize();
      },
      done, std::move(label));
  return done;
}

}  // namespace distopt::plugins::hybrid
