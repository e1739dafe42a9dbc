// The copy queues of `hybrid`: gradients device-to-host (D2H) and updated
// parameters host-to-device (H2D), one chunk (parameter) at a time, each with
// its own completion so that the host step of chunk i runs while chunk i+1
// is still being copied (Megatron-LM's HybridDeviceOptimizer: one CUDA side
// stream per direction and one event per chunk).
//
// HostTransfer: for parameters in host memory (this project's CPU machines:
// the "device" is the CPU too, the copies are host copies), and for device
// parameters without overlap (synchronous copy_ on the caller's stream).
// With overlap it runs the queued work on its own thread (sdk::SerialWorker),
// in submission order; without, it runs the work inline. The same chunking,
// per-chunk completion and copy-back run in both, so on the CPU the pipeline
// is exercised and tested; only the copy engine differs on a GPU.
// StreamTransfer (stream_transfer.hpp): device parameters with overlap.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "distopt/sdk/base/request.hpp"
#include "distopt/sdk/base/serial_worker.hpp"

namespace distopt::plugins::hybrid {

/// One ordered queue of copy work between the parameters' memory and host memory.
class Transfer {
 public:
  virtual ~Transfer() = default;
  /// Queue `work` (copies of one chunk, possibly a check) behind the work
  /// submitted before; returns a completion that fires once it has run:
  /// DOPT_OK, or the status of the sdk::Error it threw (DOPT_ERR_INTERNAL for
  /// another exception) with "<label>: <what>". The caller keeps what `work`
  /// references alive until the completion fired, also on error paths.
  /// Called from the training thread only.
  virtual std::shared_ptr<sdk::Completion> submit(std::function<void()> work,
                                                  std::string label) = 0;
  /// Whether work may queue copies with non_blocking = true: the transfer
  /// waits for them before completing (false: copies must be synchronous).
  virtual bool non_blocking() const { return false; }
};

/// Transfer for host-memory parameters. overlap: work runs on one worker
/// thread (in order); otherwise inline in submit (completed on return).
/// Destruction waits for the running work and aborts queued work.
class HostTransfer : public Transfer {
 public:
  /// `component` prefixes the worker's error messages ("hybrid d2h").
  HostTransfer(const std::string& component, bool overlap);
  std::shared_ptr<sdk::Completion> submit(std::function<void()> work, std::string label) override;

 private:
  std::string component_;
  std::unique_ptr<sdk::SerialWorker> worker_;  // null without overlap; last member
};

}  // namespace distopt::plugins::hybrid
