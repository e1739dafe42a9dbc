#include "transfer.hpp"

#include <exception>
#include <utility>

namespace distopt::plugins::hybrid {

HostTransfer::HostTransfer(const std::string& component, bool overlap) : component_(component) {
  if (overlap) worker_ = std::make_unique<sdk::SerialWorker>(component);
}

std::shared_ptr<sdk::Completion> HostTransfer::submit(std::function<void()> work,
                                                      std::string label) {
  auto done = std::make_shared<sdk::Completion>(label);
  if (worker_) {
    worker_->submit(std::move(work), done, std::move(label));
    return done;
  }
  // Inline: the same outcome and message as the worker's.
  try {
    work();
    done->complete(DOPT_OK);
  } catch (const sdk::Error& e) {
    done->complete(e.status(), component_ + ": " + label + ": " + e.what());
  } catch (const std::exception& e) {
    done->complete(DOPT_ERR_INTERNAL, component_ + ": " + label + ": " + e.what());
  }
  return done;
}

}  // namespace distopt::plugins::hybrid
