// distopt's exception hierarchy. Every error the runtime raises is a
// distopt::Error carrying where it came from, so a user sees which plugin,
// component, operation, file or peer failed.
#pragma once

#include <stdexcept>
#include <string>

#include "distopt/abi.h"

namespace distopt {

/// Base of every error distopt throws. what() is the full, user-facing message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Bad YAML or option: message names file:line:column, key and valid keys.
class ConfigError : public Error {
  using Error::Error;
};

/// A plugin could not be loaded or a component is unavailable.
class PluginError : public Error {
  using Error::Error;
};

/// A component returned a negative dopt_status.
class ComponentError : public Error {
 public:
  /// plugin/component/operation name the failing call; detail is the error
  /// sink's message (may be empty).
  ComponentError(dopt_status status, const std::string& component, const std::string& operation,
                 const std::string& detail)
      : Error(component + ": " + operation + " failed (" + dopt_status_string(status) + ")" +
              (detail.empty() ? "" : ": " + detail)),
        status_(status) {}
  dopt_status status() const noexcept { return status_; }

 private:
  dopt_status status_;
};

/// Communication failure (dead peer, broken connection, bad frame, timeout).
class CommError : public ComponentError {
  using ComponentError::ComponentError;
};

/// Rendezvous failed: store unreachable, bad token, timeout waiting for ranks.
class RendezvousError : public Error {
  using Error::Error;
};

/// Checkpoint missing, corrupt or incompatible.
class CheckpointError : public Error {
  using Error::Error;
};

/// An elastic recovery (distopt/elastic.hpp) could not keep the job going:
/// fewer survivors than elastic.min_ranks, a shard lost with its buddy, no
/// commit every survivor holds, a rank that reached the recovery after its
/// membership closed. The message says which and what is left (the disk
/// checkpoint).
class ElasticError : public Error {
  using Error::Error;
};

}  // namespace distopt
