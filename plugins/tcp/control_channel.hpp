// The control channel: one framed connection per peer, read eagerly by its
// own thread. It carries point-to-point messages (matched by peer and tag, in
// order; early arrivals are buffered) and two notices: BYE (the peer destroyed
// the communicator on purpose) and ABORT (the peer saw a failure; its cause
// names the rank that died). A control connection that reaches EOF without a
// BYE means the peer process died, which is how every rank learns of a death
// promptly, even ranks that were not exchanging data with it. Idle
// connections carry a keep-alive PING, so a timeout can name the peers that
// went silent (a cut link or a stopped process sends no EOF).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distopt/sdk/base/request.hpp"
#include "socket.hpp"

namespace distopt::plugins::tcp {

class TcpComm;

class ControlChannel {
 public:
  /// Takes ownership of nothing: fds belong to the communicator's mesh.
  ControlChannel(TcpComm* comm, int rank, std::vector<int> fds);
  ~ControlChannel();  // stops the thread if still running (without BYE)

  /// Queue a message to `peer`; the request completes when it is on the wire.
  void post_send(int peer, int tag, const char* data, size_t len,
                 std::shared_ptr<sdk::Completion> req);
  /// Post a receive; completes when the matching (peer, tag) message arrived.
  /// The recv times out (DOPT_ERR_TIMEOUT) after timeout_s with no match.
  void post_recv(int peer, int tag, char* data, size_t len, std::shared_ptr<sdk::Completion> req);
  /// The communicator failed: complete pending send / recv work and, if `notify`,
  /// send ABORT(cause) to the peers.
  void on_failure(dopt_status status, const std::string& cause, bool notify);
  /// Graceful stop: abort pending send / recv work, send BYE to every live peer, join.
  void stop();
  /// True once `peer` announced it destroyed the communicator. Thread-safe.
  bool said_bye(int peer) const;
  /// The flags said_bye reads, one per rank (shared-memory waits poll them):
  /// valid as long as this ControlChannel.
  const std::atomic<bool>* bye_flags() const;
  /// "rank 2 silent for 10.3 s (unreachable, or stopped)": the peers (not
  /// gone with BYE) from which nothing, not even a keep-alive ping, arrived
  /// for three ping intervals (timeout_s / 8, at most 1 s, each); "" when
  /// every peer was heard. Thread-safe.
  std::string silence() const;

  struct State;

 private:
  void loop();
  void wake();
  TcpComm* comm_;
  std::unique_ptr<State> st_;
  std::thread thread_;
};

}  // namespace distopt::plugins::tcp
