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
#include "mesh.hpp"
#include "request.hpp"
#include "ring.hpp"
#include "shm_collectives.hpp"

namespace distopt::plugins::tcp {

class Control;

/// The component's options (see the schema in plugin.cpp).
struct Config {
  double timeout_s = 60;
  int64_t chunk_bytes = 256 << 10;  ///< reduction staging window / pipeline grain
  int64_t socket_buffer_bytes = 0;  ///< 0 = kernel autotuning
  int64_t max_io_bytes = 4 << 20;   ///< largest single send()/recv()
  bool shm = true;                  ///< shared memory for collectives when all ranks share a host
  int64_t shm_bytes =
      1 << 20;  ///< per-rank shared segment: two slots, small enough to stay in cache
};

/// An error for the caller of an API function, returned as status + message.
struct ApiError {
  dopt_status status;
  std::string msg;
};

/// A DLTensor checked to be dense host memory.
struct Buffer {
  char* data = nullptr;
  size_t count = 0;      ///< elements
  size_t elem_size = 0;  ///< bytes per element
  DLDataType dtype{};
  size_t bytes() const { return count * elem_size; }
};

class TcpComm {
 public:
  /// Collective; builds the mesh. Throws ApiError.
  static TcpComm* create(const dopt_create_args& args, const Config& cfg);
  /// Aborts pending work (DOPT_ERR_ABORTED), says goodbye to peers, joins threads, closes sockets.
  ~TcpComm();

  int rank() const { return rank_; }
  int world_size() const { return world_; }

  // Each returns a started request or throws ApiError for bad arguments.
  std::shared_ptr<Request> allreduce(const DLTensor* send, DLTensor* recv, dopt_reduce_op op);
  std::shared_ptr<Request> reduce_scatter(const DLTensor* send, DLTensor* recv, dopt_reduce_op op);
  std::shared_ptr<Request> allgather(const DLTensor* send, DLTensor* recv);
  std::shared_ptr<Request> broadcast(DLTensor* buf, int root);
  std::shared_ptr<Request> send(const DLTensor* buf, int peer, int tag);
  std::shared_ptr<Request> recv(DLTensor* buf, int peer, int tag);
  std::shared_ptr<Request> barrier();
  /// Blocking, collective; nullptr for color < 0. Throws ApiError.
  TcpComm* split(int color, int key);

  /// Record the first failure (later ones are ignored): every pending and
  /// future operation completes with `status` and "<op>: <cause>". Wakes the
  /// progress thread and tells peers (ABORT notice) unless `from_peer`.
  void fail(dopt_status status, const std::string& cause, bool notify_peers);
  /// The recorded failure, if any.
  bool failed(dopt_status* status, std::string* cause) const;
  double timeout_s() const { return cfg_.timeout_s; }

 private:
  struct Op {
    std::shared_ptr<Request> req;
    std::function<RingResult()> body;
  };

  TcpComm(const dopt_create_args& args, const Config& cfg, Mesh mesh,
          std::unique_ptr<ShmTransport> shm);
  std::shared_ptr<Request> enqueue(const std::string& name, std::function<RingResult()> body);
  void progress_loop();
  void run_op(Op& op);
  RingResult run(const RingPlan& plan, Clock::time_point deadline);
  ShmWaitCtx shm_ctx(Clock::time_point deadline);
  Buffer check(const DLTensor* t, const char* op, const char* which, bool reduce_dtype,
               DType* dt = nullptr) const;
  char* scratch(size_t bytes);

  // Identity and what split() needs to create sub-communicators.
  int rank_, world_;
  Config cfg_;
  dopt_store* store_;
  std::string scope_, token_, bind_address_;
  int split_seq_ = 0;

  Mesh mesh_;
  std::unique_ptr<Control> control_;
  std::unique_ptr<ShmTransport> shm_;  ///< null: collectives use the TCP ring

  // Progress thread and its queue.
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  std::thread progress_;
  std::vector<char> staging_, scratch_;  // progress thread only
  FaultPoint fault_;                     // progress thread only

  // Failure state. aborting_ + abort_fd_ (an eventfd) wake a running operation.
  mutable std::mutex fmu_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborting_{false};
  int abort_fd_ = -1;
  bool destroying_ = false;
  dopt_status fail_status_ = DOPT_OK;
  std::string fail_cause_;
};

}  // namespace distopt::plugins::tcp

/// The opaque handle handed to the host.
struct dopt_comm {
  distopt::plugins::tcp::TcpComm* impl;
};
