// One rank's endpoint of a `tcp` communicator: what the SDK's p2p shell
// (sdk/collective/p2p_communicator.hpp: checks, op queue, progress thread, shm and p2p
// collectives, failure state, split) does not own: the mesh of
// connections, the SocketTransport over its data connections, and the
// control channel (user send/recv, failure notices, goodbyes) that lets a
// failure name the rank that really died.
#pragma once

#include <memory>
#include <string>

#include "distopt/communicator.h"
#include "distopt/sdk/collective/p2p_communicator.hpp"
#include "mesh.hpp"
#include "socket_transport.hpp"

namespace distopt::plugins::tcp {

class ControlChannel;

/// The component's options (see the schema in plugin.cpp).
struct Config : sdk::p2p::ShellConfig {
  /// This component's keys from a validated options object (the shell's
  /// config_of reads the shell's keys and calls it).
  void read_own(const sdk::OptionsView& o);

  int64_t chunk_bytes = 256 << 10;  ///< pipeline grain of the TCP ring (segment bytes)
  int64_t socket_buffer_bytes = 0;  ///< 0 = kernel autotuning
  int64_t max_io_bytes = 4 << 20;   ///< largest single send()/recv()
};

/// Requests and failures as sdk::p2p::P2PCommunicator says; user send/recv
/// go over the control connections (ControlChannel), not the data mesh.
class TcpComm final : public sdk::p2p::P2PCommunicator {
 public:
  /// Collective; builds the mesh. Options from args.options. Throws sdk::Error.
  explicit TcpComm(const dopt_create_args& args);
  /// Aborts pending work (DOPT_ERR_ABORTED), says goodbye to peers, joins threads, closes sockets.
  ~TcpComm() override;

 private:
  TcpComm(const dopt_create_args& args, const Config& cfg);

  // The shell's hooks (sdk/collective/p2p_communicator.hpp).
  std::unique_ptr<sdk::Communicator> split_child(const dopt_create_args& a) override;
  void wake_transport() override;
  std::string describe_failure(dopt_status status, const std::string& cause,
                               bool notify_peers) override;
  void on_failure(dopt_status status, const std::string& why, bool notify_peers) override;
  int failed_peer(std::string* why) override;
  void refine_failure(Result& r) override;
  void add_wait_signals(sdk::shm::WaitCtx& c) override;
  void take_bytes(uint64_t* sent, uint64_t* received) override;
  bool recv_after_failure() const override { return true; }  // ControlChannel::on_recv_cmd
  void post_user(const std::shared_ptr<sdk::Completion>& req, bool is_send, int peer, int32_t tag,
                 const sdk::HostBuffer& b) override;

  Config cfg_;
  Mesh mesh_;
  std::unique_ptr<SocketTransport> transport_;  // progress thread only
  std::unique_ptr<ControlChannel> control_;
  int abort_fd_ = -1;  ///< eventfd written with aborting_: wakes a running operation's poll()
};

}  // namespace distopt::plugins::tcp
