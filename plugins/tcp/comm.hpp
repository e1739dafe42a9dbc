// One rank's endpoint of a `tcp` communicator: the mesh of connections, the
// progress thread that runs collectives in issue order, the control channel
// (p2p + failure notices), and the failure state shared by all of them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distopt/communicator.h"
#include "distopt/sdk/host_buffer.hpp"
#include "distopt/sdk/p2p_collectives.hpp"
#include "distopt/sdk/plugin.hpp"
#include "mesh.hpp"
#include "op_result.hpp"
#include "socket_transport.hpp"

namespace distopt::plugins::tcp {

class Control;

/// The component's options (see the schema in plugin.cpp).
struct Config {
  /// Read from a validated options object; nullptr: the schema's defaults.
  static Config from(const dopt_options* options);

  double timeout_s = 60;
  int64_t chunk_bytes = 256 << 10;  ///< pipeline grain of the TCP ring (segment bytes)
  int64_t socket_buffer_bytes = 0;  ///< 0 = kernel autotuning
  int64_t max_io_bytes = 4 << 20;   ///< largest single send()/recv()
  bool shm = true;                  ///< shared memory for collectives when all ranks share a host
  int64_t shm_bytes =
      1 << 20;  ///< per-rank shared segment: two slots, small enough to stay in cache
};

using Buffer = sdk::HostBuffer;  ///< a checked tensor argument (sdk/host_buffer.hpp)

/// Requests handed to the host are sdk::CompletionRequests over a shared
/// sdk::Completion named after the operation ("allreduce", "send", ...): the
/// progress and control threads complete it with "<op>: <cause>" on failure,
/// and a wait that times out says "<op>: not complete after waiting N ms".
class TcpComm final : public sdk::Communicator {
 public:
  /// Collective; builds the mesh. Options from args.options. Throws sdk::Error.
  explicit TcpComm(const dopt_create_args& args);
  /// Aborts pending work (DOPT_ERR_ABORTED), says goodbye to peers, joins threads, closes sockets.
  ~TcpComm() override;

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

  /// Record the first failure (later ones are ignored): every pending and
  /// future operation completes with `status` and "<op>: <cause>". Wakes the
  /// progress thread and tells peers (ABORT notice) unless `from_peer`.
  void fail(dopt_status status, const std::string& cause, bool notify_peers);
  /// The recorded failure, if any.
  bool failed(dopt_status* status, std::string* cause) const;
  double timeout_s() const { return cfg_.timeout_s; }

 private:
  struct Op {
    std::shared_ptr<sdk::Completion> req;
    std::function<OpResult()> body;
  };
  /// What the constructor connects before it starts the threads.
  struct Links {
    Mesh mesh;
    std::unique_ptr<sdk::shm::Collectives> shm;  ///< null: collectives use the TCP ring
  };

  TcpComm(const dopt_create_args& args, const Config& cfg);
  TcpComm(const dopt_create_args& args, const Config& cfg, Links links);
  /// Checks args and builds the mesh and the shared-memory transport. Collective.
  static Links connect(const dopt_create_args& args, const Config& cfg);
  /// The caller's handle on a completion.
  static std::unique_ptr<sdk::Request> request(std::shared_ptr<sdk::Completion> c);
  std::unique_ptr<sdk::Request> enqueue(const std::string& name, std::function<OpResult()> body);
  void progress_loop();
  void run_op(Op& op);
  /// Run `body` (SDK collectives over transport_) until `deadline`; its
  /// sdk::Error becomes the result (COMM names the peer whose connection broke).
  OpResult run_p2p(const std::function<void(Clock::time_point)>& body);
  ShmWaitCtx shm_ctx(Clock::time_point deadline);
  Buffer check(const DLTensor& t, const char* op, const char* which, bool reduce_dtype,
               DType* dt = nullptr) const;

  // Identity and what split() needs to create sub-communicators.
  int rank_, world_;
  Config cfg_;
  dopt_store* store_;
  std::string scope_, token_, bind_address_;
  int split_seq_ = 0;

  Mesh mesh_;
  std::unique_ptr<Control> control_;
  std::unique_ptr<sdk::shm::Collectives> shm_;  ///< null: collectives use the TCP ring

  // Progress thread and its queue.
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::thread progress_;
  FaultPoint fault_;                             // progress thread only
  std::unique_ptr<SocketTransport> transport_;   // progress thread only
  std::unique_ptr<sdk::p2p::Collectives> coll_;  // progress thread only

  // Failure state. aborting_ + abort_fd_ (an eventfd) wake a running operation.
  mutable std::mutex fmu_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborting_{false};
  std::atomic<bool> destroying_now_{false};  ///< the destructor runs: abort without grace
  int abort_fd_ = -1;
  bool destroying_ = false;
  dopt_status fail_status_ = DOPT_OK;
  std::string fail_cause_;
};

}  // namespace distopt::plugins::tcp
