// sdk::p2p::Transport over UCP tag matching (UCX 1.13): one context and one
// worker per communicator, one endpoint per peer.
//
// UCP tag (64 bits) = communicator id (8) | sender rank (16) | p2p tag (40,
// sdk::p2p::Tag), received with a full mask, so split communicators and
// concurrent collectives never match each other's messages (UCC's layout
// in spirit: scope id, sender, sequence number); on the wire, its image
// under TagCipher (a bijection keyed by the job token).
//
// Endpoints use UCP_ERR_HANDLING_MODE_PEER: when a peer dies, UCX calls the
// error handler, which marks the peer failed; wait_all then fails every
// pending operation with DOPT_ERR_COMM naming it, after a 1 s grace period
// for notices, and the worker is not progressed again (a failed transport
// writes nothing more into the caller's buffers). The rank that sees it
// first tells every other live rank (a notice on a reserved tag, one
// receive pre-posted per peer), so ranks that never talk to the dead one
// (a ring of 4) fail at once too, naming it, instead of timing out.
//
// Trust model: the job token (DISTOPT_JOB_TOKEN) guards the rendezvous
// store, through which the worker addresses travel, but UCX itself checks
// nothing: its tcp transport accepts any connection, matches any connected
// worker's tagged messages, and aborts the process on a malformed stream
// (UCX 1.13). So (1) the listening TCP sockets the worker opens drop every
// packet from an IPv4 source that is not one of the job's hosts' addresses
// (each rank publishes its host's addresses with its worker address;
// listener_filter.hpp), and (2) the tags on the wire are the layout's tags
// under a permutation keyed by the token (tag_cipher.hpp), so a process
// that gets through without the token cannot complete a receive. Not
// protected: processes on a job's host (they pass the filter and can crash
// UCX with junk, though not inject data), the window between the worker's
// creation and connect() (the filter then allows this host only), IPv6
// listeners, anyone who sees the traffic (no encryption, payloads not
// authenticated, tags replayable), non-TCP transports (shared memory is
// this host's; InfiniBand has its own fabric partitioning), and floods
// (unmatched messages are kept by UCX).
//
// UCX picks its transports itself; UCX_TLS (e.g. "tcp", "sm,tcp") and
// UCX_NET_DEVICES (e.g. "eth0", "mlx5_0:1") restrict them (read by
// ucp_config_read at creation). Where CMA is not permitted (containers
// without ptrace rights), UCX uses its other shared-memory or TCP lanes.
//
// Thread safety: none. Create on any thread, then use from one thread only
// (the communicator's progress thread); the worker is SERIALIZED.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "distopt/sdk/base/fault_point.hpp"
#include "distopt/sdk/transport/p2p_transport.hpp"
#include "tag_cipher.hpp"

namespace distopt::plugins::ucx {

using sdk::p2p::Clock;
using sdk::p2p::Handle;

class UcpTransport final : public sdk::p2p::Transport {
 public:
  /// Context + worker. comm_id: 8 bits separating communicators.
  /// peer_errors: endpoints with UCP_ERR_HANDLING_MODE_PEER (a dead peer is
  /// reported); UCX 1.13 then leaves out its shared-memory transports
  /// (posix/sysv have no peer failure handler) and uses TCP (+ CMA) on one
  /// host. token: the job token, keying the tags (every rank must pass the
  /// same). With source_filter, the worker's IPv4 listeners accept this
  /// host only until admit(), then the job's hosts; without, anyone. Throws
  /// sdk::Error(DOPT_ERR_COMM) when UCX cannot be initialised. Not thread-safe against other
  /// threads opening listening sockets meanwhile (see listener_filter.hpp).
  UcpTransport(int rank, int world, uint8_t comm_id, bool peer_errors,
               const std::string& token = "", bool source_filter = true);
  /// Force-closes the endpoints still open, then frees worker and context.
  ~UcpTransport() override;

  /// What to publish through the rendezvous store: the worker's address
  /// and this host's IPv4 addresses (opaque bytes).
  std::string address() const { return address_; }
  /// Let the listeners accept the hosts named in what every rank published
  /// (index = rank; own entry ignored). Call it on every rank before any
  /// rank calls connect(): a peer's SYN dropped before costs it a 1 s
  /// retransmission. Throws sdk::Error(DOPT_ERR_COMM) for a malformed entry.
  void admit(const std::vector<std::string>& addresses);
  /// Create the endpoints to every peer (admit() first if it was not
  /// called). Progress thread. Throws sdk::Error(DOPT_ERR_COMM).
  void connect(const std::vector<std::string>& addresses);
  /// The listening IPv4 TCP sockets of the worker that carry a source filter.
  size_t filtered_listeners() const { return listeners_.size(); }
  /// Close the endpoints: flushed, so that what was sent arrives before the
  /// disconnect, waiting until `deadline` (a close still running then is
  /// left to ucp_worker_destroy); all forced at once after a failure.
  /// Progress thread.
  void close(Clock::time_point deadline);

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Handle isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  Handle irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  bool test(Handle h) override;
  void wait_all(const Handle* hs, size_t n, Clock::time_point deadline) override;

  /// Give up on `h` (a receive is cancelled; UCX no longer writes its buffer).
  void cancel(Handle h) { release(&h, 1); }
  /// Drive UCX once (and the idle hook); true if anything happened.
  bool progress();
  /// Called from every progress() (the communicator completes user
  /// send/recv there, so they advance while a collective runs).
  void set_progress_hook(std::function<void()> f) { hook_ = std::move(f); }
  /// Make wait_all throw DOPT_ERR_ABORTED (any thread).
  void abort() { aborting_ = true; }
  /// The first failed peer and why (-1: none). Progress thread.
  int failed_peer(std::string* why) const;
  /// Fault injection (sdk::FaultPoint): told about every isend. May be null.
  void set_fault(sdk::FaultPoint* f) { fault_ = f; }
  /// Bytes handed to isend since creation.
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Peer;
  /// Filled by UCX's receive callback (the length is reliable only there).
  struct RecvState {
    bool done = false;
    ucs_status_t status = UCS_INPROGRESS;
    size_t length = 0;
    bool released = false;  ///< its Op no longer points here
  };
  struct Op {
    void* req = nullptr;  ///< UCP request; nullptr: completed at once
    int peer = -1;
    bool recv = false;
    size_t bytes = 0;
    ucs_status_t status = UCS_INPROGRESS;
    size_t received = 0;
    RecvState* state = nullptr;  ///< receives: owned by states_
  };
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  /// Post the failure-notice receives (one per peer). Progress thread.
  void post_notices();
  /// Read arrived notices; send ours once a peer failed here. Progress thread.
  void exchange_notices();
  /// Throw DOPT_ERR_COMM naming the failed peer, if any.
  void throw_if_failed();
  uint64_t ucp_tag(int sender, uint64_t tag) const;
  Handle add(Op op);
  /// Refresh op's status from its request; true when no longer in progress.
  bool poll(Op& op);
  /// Release the handles (cancel what still runs).
  void release(const Handle* hs, size_t n);
  /// After a failure or timeout: release the handles and never progress the
  /// worker again, so UCX writes no more into buffers the caller gets back
  /// (a matched rendezvous receive cannot be cancelled).
  void quiesce(const Handle* hs, size_t n);
  [[noreturn]] void fail_op(const Op& op, const char* what);

  /// Filter the worker's listeners to `hosts`; a warning if the kernel refuses.
  void filter_listeners(const std::vector<uint32_t>& hosts);

  int rank_, world_;
  uint8_t comm_id_;
  bool peer_errors_;
  bool source_filter_;
  TagCipher cipher_;
  std::vector<int> listeners_;        ///< the worker's listening IPv4 TCP sockets
  std::vector<uint32_t> my_hosts_;    ///< this host's IPv4 addresses
  std::vector<std::string> workers_;  ///< peers' worker addresses, set by admit()
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unordered_map<Handle, Op> ops_;
  /// Receive states; one is erased only once its callback ran (a cancelled
  /// receive completes later), by sweep_states().
  std::list<RecvState> states_;
  void sweep_states();
  Handle next_ = 0;
  std::function<void()> hook_;
  std::atomic<bool> aborting_{false};
  uint64_t bytes_sent_ = 0;
  sdk::FaultPoint* fault_ = nullptr;
  struct Notice {
    char text[256];
  };
  std::vector<Notice> notice_in_;   ///< one per peer
  std::vector<void*> notice_recv_;  ///< their requests (null: done)
  std::vector<void*> notice_send_;  ///< ours, freed at close
  bool notified_ = false;
  int first_failed_ = -1;  ///< the failure reported to the user
  Clock::time_point failed_at_{};
  bool quiesced_ = false;
  /// How long a failing operation keeps progressing after the first failure
  /// seen, so that notices arrive: a peer that closed because of a third
  /// rank's death is not named instead of it (tcp waits 2 s likewise).
  static constexpr std::chrono::milliseconds kGrace{1000};
  std::string notice_out_;
};

}  // namespace distopt::plugins::ucx
