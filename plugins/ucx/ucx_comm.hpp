// One rank's endpoint of a `ucx` communicator: what the SDK's p2p shell
// (sdk/collective/p2p_communicator.hpp: checks, op queue, progress thread, shm and p2p
// collectives, user send/recv, failure state, split) does not own: the
// UcpTransport and its set-up (address exchange through the store), UCX's
// view of failed peers during shared-memory waits, and driving UCX while
// idle (so a peer's large send or close never stalls on this rank).
#pragma once

#include <memory>
#include <string>

#include "distopt/communicator.h"
#include "distopt/sdk/collective/p2p_communicator.hpp"
#include "ucp_transport.hpp"

namespace distopt::plugins::ucx {

/// The component's options (see the schema in plugin.cpp).
struct Config : sdk::p2p::ShellConfig {
  /// This component's keys from a validated options object (the shell's
  /// config_of reads the shell's keys and calls it).
  void read_own(const sdk::OptionsView& o);

  int64_t small_bytes = 64 << 10;   ///< allreduce/broadcast latency path up to this size
  int64_t segment_bytes = 1 << 20;  ///< pipeline grain of ring and chain
  bool peer_errors = true;          ///< UCP_ERR_HANDLING_MODE_PEER (see UcpTransport)
  bool source_filter = true;        ///< listeners admit the job's hosts only (listener_filter.hpp)
};

/// Requests and failures as sdk::p2p::P2PCommunicator says; user send/recv
/// are UCP tag messages tagged Tag::user(tag).
class UcxComm final : public sdk::p2p::P2PCommunicator {
 public:
  /// Collective: creates the UCP worker, exchanges addresses through the
  /// rendezvous store, connects. Options from args.options. Throws sdk::Error.
  explicit UcxComm(const dopt_create_args& args);
  /// Aborts pending work (DOPT_ERR_ABORTED), joins the progress thread,
  /// closes the endpoints (failed peers forced, the others flushed for up to 2 s), frees UCX.
  ~UcxComm() override;

 private:
  UcxComm(const dopt_create_args& args, const Config& cfg);

  // The shell's hooks (sdk/collective/p2p_communicator.hpp): UCX's failure view, byte
  // count and idle progress; the shell's own user send/recv over UCP tags.
  int failed_peer(std::string* why) override;
  void add_wait_signals(sdk::shm::WaitCtx& c) override;
  bool idle_progress() override;
  void cancel(Handle h) override;
  void take_bytes(uint64_t* sent, uint64_t* received) override;
  void wake_transport() override;
  std::unique_ptr<sdk::Communicator> split_child(const dopt_create_args& a) override;

  /// Called while a shm collective waits (progress thread): every 5 ms at
  /// most, drives UCX so its error callbacks and failure notices run, and
  /// returns the failed peer (why in *why) once it has been known for the
  /// transport's grace period (so a notice can name the rank that really
  /// died), else -1.
  int shm_failed_peer(std::string* why);

  Config cfg_;
  std::unique_ptr<UcpTransport> transport_;
  uint64_t sent_taken_ = 0;               // progress thread only
  Clock::time_point shm_failure_seen_{};  // progress thread only
  Clock::time_point shm_polled_{};        // last shm_failed_peer progress
};

}  // namespace distopt::plugins::ucx
