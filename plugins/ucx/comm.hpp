// One rank's endpoint of a `ucx` communicator: a UcpTransport, the SDK's
// p2p collectives over it (or, when every rank is on one host, the SDK's
// shared-memory collectives for allreduce, reduce_scatter, allgather and
// broadcast), and the progress thread that runs operations in issue order
// and drives UCX all the time (also while idle, so a peer's large send or
// close never stalls on this rank).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "distopt/communicator.h"
#include "distopt/sdk/fault_point.hpp"
#include "distopt/sdk/host_buffer.hpp"
#include "distopt/sdk/p2p_collectives.hpp"
#include "distopt/sdk/plugin.hpp"
#include "distopt/sdk/shm_collectives.hpp"
#include "ucp_transport.hpp"

namespace distopt::plugins::ucx {

/// The component's options (see the schema in plugin.cpp).
struct Config {
  /// Read from a validated options object; nullptr: the schema's defaults.
  static Config from(const dopt_options* options);

  double timeout_s = 60;
  int64_t small_bytes = 64 << 10;   ///< allreduce/broadcast latency path up to this size
  int64_t segment_bytes = 1 << 20;  ///< pipeline grain of ring and chain
  bool peer_errors = true;          ///< UCP_ERR_HANDLING_MODE_PEER (see UcpTransport)
  bool source_filter = true;        ///< listeners admit the job's hosts only (listener_filter.hpp)
  bool shm = true;                  ///< sdk::shm collectives when all ranks share a host
  int64_t shm_bytes = 1 << 20;      ///< per-rank shared segment (two slots)
};

using Buffer = sdk::HostBuffer;  ///< a checked tensor argument (sdk/host_buffer.hpp)

/// Requests are sdk::CompletionRequests named after the operation; a failed
/// operation completes with "<op>: <cause>" (e.g. "allreduce: rank 2:
/// connection lost (...)"). The first failure is permanent: later
/// operations fail with it at once.
class UcxComm final : public sdk::Communicator {
 public:
  /// Collective: creates the UCP worker, exchanges addresses through the
  /// rendezvous store, connects. Options from args.options. Throws sdk::Error.
  explicit UcxComm(const dopt_create_args& args);
  /// Aborts pending work (DOPT_ERR_ABORTED), joins the progress thread,
  /// closes the endpoints (failed peers forced, the others flushed for up to 2 s), frees UCX.
  ~UcxComm() override;

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_; }

  // Each returns a started request or throws sdk::Error for bad arguments.
  std::unique_ptr<sdk::Request> allreduce(const DLTensor& send, DLTensor& recv,
                                          dopt_reduce_op op) override;
  std::unique_ptr<sdk::Request> reduce_scatter(const DLTensor& send, DLTensor& recv,
                                               dopt_reduce_op op) override;
  std::unique_ptr<sdk::Request> allgather(const DLTensor& send, DLTensor& recv) override;
  std::unique_ptr<sdk::Request> broadcast(DLTensor& buf, int32_t root) override;
  std::unique_ptr<sdk::Request> send(const DLTensor& buf, int32_t peer, int32_t tag) override;
  std::unique_ptr<sdk::Request> recv(DLTensor& buf, int32_t peer, int32_t tag) override;
  std::unique_ptr<sdk::Request> barrier() override;
  /// Blocking, collective; nullptr for color < 0. Throws sdk::Error.
  std::unique_ptr<sdk::Communicator> split(int32_t color, int32_t key) override;

 private:
  using Body = std::function<void(Clock::time_point deadline)>;
  struct Op {
    std::shared_ptr<sdk::Completion> req;
    Body body;
  };
  /// A user send/recv posted on the transport, completed by the progress hook.
  struct UserOp {
    std::shared_ptr<sdk::Completion> req;
    Handle handle;
    int peer;
    Clock::time_point deadline;  ///< fails with TIMEOUT after timeout_s
  };

  UcxComm(const dopt_create_args& args, const Config& cfg);
  std::unique_ptr<sdk::Request> enqueue(const std::string& name, Body body);
  void progress_loop();
  void run_op(Op& op);
  /// Post queued user send/recv, complete finished ones (progress thread).
  void complete_user_ops();
  /// Queue a user send/recv: posted by the progress thread, even mid-collective.
  std::unique_ptr<sdk::Request> post_user(const std::string& name, bool is_send, int peer,
                                          int32_t tag, const Buffer& b);
  /// Record the first failure; later operations fail with it.
  void fail(dopt_status status, const std::string& cause);
  bool failed(dopt_status* status, std::string* cause) const;
  Clock::time_point deadline() const;
  /// Through the store, collective: the shared-memory collectives, or null
  /// (ranks on several hosts, shm off on a rank). Throws sdk::Error(COMM).
  void create_shm(const dopt_create_args& args);
  /// A wait context for the shm collectives: the deadline, the abort flag,
  /// and UCX's view of failed peers (shm_failed_peer).
  sdk::shm::WaitCtx shm_ctx(Clock::time_point deadline);
  /// Called while a shm collective waits (progress thread): every 5 ms at
  /// most, drives UCX so its error callbacks and failure notices run, and
  /// returns the failed peer (why in *why) once it has been known for the
  /// transport's grace period (so a notice can name the rank that really
  /// died), else -1.
  int shm_failed_peer(std::string* why);
  Buffer check(const DLTensor& t, const char* op, const char* which, bool reduce_dtype,
               sdk::DType* dt = nullptr) const;

  int rank_, world_;
  Config cfg_;
  dopt_store* store_;
  std::string scope_, token_, bind_address_;
  int split_seq_ = 0;

  std::unique_ptr<UcpTransport> transport_;
  std::unique_ptr<sdk::p2p::Collectives> coll_;  // progress thread only
  std::unique_ptr<sdk::shm::Collectives> shm_;   // null: everything over UCX
  uint64_t shm_sent_ = 0;                        // bytes shm_ handed to peers
  Clock::time_point shm_failure_seen_{};         // progress thread only
  Clock::time_point shm_polled_{};               // last shm_failed_peer progress
  std::atomic<bool> aborting_{false};            // set by the destructor
  std::list<UserOp> user_ops_;                   // progress thread only
  std::deque<std::function<void()>> posts_;      // user send/recv to post (under qmu_)
  sdk::FaultPoint fault_;                        // progress thread only

  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::thread progress_;

  mutable std::mutex fmu_;
  std::atomic<bool> failed_{false};
  bool destroying_ = false;
  dopt_status fail_status_ = DOPT_OK;
  std::string fail_cause_;
};

}  // namespace distopt::plugins::ucx
