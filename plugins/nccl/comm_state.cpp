// CommState: launching operations on the communicator's stream, the send / recv
// group queue, split and teardown (comm_state.hpp).
#include "comm_state.hpp"

#include <cstdio>

#include "bootstrap.hpp"

namespace distopt::plugins::nccl {
namespace {

void check_cuda(const Api& a, cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw sdk::Error(DOPT_ERR_COMM, what + " failed: " + cuda_error(a, e));
}

}  // namespace

CommState::CommState(const Api& api, const Settings& settings, int r, int w, int dev,
                     ncclComm_t comm)
    : a(api), s(settings), rank(r), world(w), device(dev), comm_(comm) {
  try {
    a.cudaSetDevice(device);
    check_cuda(a, a.cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    ready_ = std::make_shared<Event>(a, device);
    check_cuda(a, a.cudaMalloc(&scratch_, sizeof(int32_t)), "cudaMalloc (barrier scratch)");
  } catch (...) {
    if (stream_) a.cudaStreamDestroy(stream_);
    a.ncclCommAbort(comm_);
    throw;
  }
  watchdog_ = std::make_unique<Watchdog>(
      a, comm_, device, s, "nccl rank " + std::to_string(rank) + " of " + std::to_string(world),
      issue_mu_);
}

CommState::~CommState() { shutdown(); }

std::string CommState::next_name(const char* kind) {
  std::lock_guard<std::mutex> lk(issue_mu_);
  return std::string(kind) + " #" + std::to_string(++seq_);
}

void CommState::refuse_if_aborted(const std::string& what) const {
  if (shut_) throw sdk::Error(DOPT_ERR_STATE, what + ": the communicator was destroyed");
  if (watchdog_->aborted())
    throw sdk::Error(DOPT_ERR_ABORTED, what + " refused: the communicator was aborted because " +
                                           watchdog_->reason());
}

void CommState::order_after_caller() {
  cudaStream_t caller = static_cast<cudaStream_t>(caller_.load());
  check_cuda(a, a.cudaEventRecord(ready_->get(), caller), "cudaEventRecord (caller stream)");
  check_cuda(a, a.cudaStreamWaitEvent(stream_, ready_->get(), 0), "cudaStreamWaitEvent");
}

void CommState::launched(const std::vector<std::shared_ptr<Op>>& ops) {
  auto done = std::make_shared<Event>(a, device);
  check_cuda(a, a.cudaEventRecord(done->get(), stream_), "cudaEventRecord (completion)");
  const auto deadline = Clock::now() + s.timeout();
  for (const auto& op : ops) {
    op->launched(done, deadline);
    watchdog_->track(op);
  }
}

template <class F>
auto CommState::locked(F&& f) {
  std::unique_lock<std::mutex> lk(issue_mu_);
  try {
    return f();
  } catch (const sdk::Error& e) {
    // NCCL's state after a failed or unsettled launch is unknown: abort, as
    // the watchdog would (the argument errors were thrown before any launch).
    if (e.status() == DOPT_ERR_COMM || e.status() == DOPT_ERR_TIMEOUT) {
      lk.unlock();
      watchdog_->abort(e.status(), e.what());
    }
    throw;
  }
}

std::unique_ptr<sdk::Request> CommState::request(std::shared_ptr<Op> op, bool p2p) {
  std::function<void()> flush_fn;
  if (p2p) {
    std::weak_ptr<CommState> weak = weak_from_this();
    flush_fn = [weak] {
      if (auto state = weak.lock()) state->flush();
    };
  }
  return std::make_unique<OpRequest>(a, std::move(op), device, std::move(flush_fn));
}

std::unique_ptr<sdk::Request> CommState::launch(
    const std::string& what, const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& enqueue) {
  auto op = std::make_shared<Op>(what);
  locked([&] {
    refuse_if_aborted(what);
    flush_locked();
    a.cudaSetDevice(device);
    order_after_caller();
    ncclResult_t r = enqueue(comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress)
      throw sdk::Error(DOPT_ERR_COMM, what + " failed: " + nccl_error(a, r, comm_));
    settle(a, comm_, Clock::now() + s.timeout(), what, &watchdog_->aborted());
    launched({op});
    return 0;
  });
  return request(std::move(op), false);
}

std::unique_ptr<sdk::Request> CommState::queue_p2p(bool is_send, void* data, size_t count,
                                                   ncclDataType_t type, int peer,
                                                   const std::string& what) {
  auto op = std::make_shared<Op>(what);
  {
    std::lock_guard<std::mutex> lk(issue_mu_);
    refuse_if_aborted(what);
    queued_.push_back({is_send, data, count, type, peer, op});
  }
  return request(std::move(op), true);
}

void CommState::flush() {
  locked([&] {
    flush_locked();
    return 0;
  });
}

void CommState::flush_locked() {
  if (queued_.empty()) return;
  std::vector<P2p> group;
  group.swap(queued_);
  std::vector<std::shared_ptr<Op>> ops;
  for (const auto& p : group) ops.push_back(p.op);
  try {
    refuse_if_aborted("send/recv group");
    a.cudaSetDevice(device);
    order_after_caller();
    ncclResult_t r = a.ncclGroupStart();
    for (const auto& p : group) {
      if (r != ncclSuccess) break;
      r = p.is_send ? a.ncclSend(p.data, p.count, p.type, p.peer, comm_, stream_)
                    : a.ncclRecv(p.data, p.count, p.type, p.peer, comm_, stream_);
    }
    const ncclResult_t end = a.ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    const std::string what =
        ops.front()->what() + " (a group of " + std::to_string(ops.size()) + " send / recv)";
    if (r != ncclSuccess && r != ncclInProgress)
      throw sdk::Error(DOPT_ERR_COMM, what + " failed: " + nccl_error(a, r, comm_));
    settle(a, comm_, Clock::now() + s.timeout(), what, &watchdog_->aborted());
    launched(ops);
  } catch (const sdk::Error& e) {
    for (const auto& op : ops) op->fail(e.status(), op->what() + ": " + e.what());
    throw;
  }
}

std::shared_ptr<CommState> CommState::split(int color, int key) {
  ncclComm_t child = nullptr;
  const std::string what = next_name("split");
  locked([&] {
    refuse_if_aborted(what);
    flush_locked();
    a.cudaSetDevice(device);
    ncclConfig_t config = nonblocking_config();
    ncclResult_t r =
        a.ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw sdk::Error(DOPT_ERR_COMM, what + " (ncclCommSplit) failed: " + nccl_error(a, r, comm_));
    const auto deadline = Clock::now() + s.timeout();
    settle(a, comm_, deadline, what + " (ncclCommSplit)", &watchdog_->aborted());
    if (child) {
      try {
        settle(a, child, deadline, what + " (the new communicator)");
      } catch (...) {
        a.ncclCommAbort(child);
        throw;
      }
    }
    return 0;
  });
  if (!child) return nullptr;
  int crank = 0, cworld = 0;
  if (a.ncclCommUserRank(child, &crank) != ncclSuccess ||
      a.ncclCommCount(child, &cworld) != ncclSuccess) {
    a.ncclCommAbort(child);
    throw sdk::Error(DOPT_ERR_COMM, what + ": cannot read the new communicator's rank and size");
  }
  return std::make_shared<CommState>(a, s, crank, cworld, device, child);
}

void CommState::shutdown() {
  std::vector<P2p> dropped;
  {
    std::lock_guard<std::mutex> lk(issue_mu_);
    if (shut_) return;
    shut_ = true;
    dropped.swap(queued_);
  }
  for (const auto& p : dropped)
    p.op->fail(DOPT_ERR_ABORTED, p.op->what() + ": the communicator was destroyed before it ran");
  const size_t pending = watchdog_->pending();
  bool graceful = !watchdog_->aborted() && pending == 0;
  if (graceful) {
    watchdog_->stop();
    a.cudaSetDevice(device);
    try {
      ncclResult_t r = a.ncclCommFinalize(comm_);
      if (r != ncclSuccess && r != ncclInProgress)
        throw sdk::Error(DOPT_ERR_COMM, "ncclCommFinalize failed: " + nccl_error(a, r, comm_));
      settle(a, comm_, Clock::now() + s.timeout(), "ncclCommFinalize");
      a.ncclCommDestroy(comm_);
    } catch (const sdk::Error& e) {
      sdk::log_warn("nccl", std::string(e.what()) + "; aborting the communicator instead");
      graceful = false;
    }
  }
  if (!graceful)
    watchdog_->abort(DOPT_ERR_ABORTED, "the communicator was destroyed with " +
                                           std::to_string(pending) + " operation(s) pending");
  watchdog_->stop();
  a.cudaSetDevice(device);
  if (scratch_) a.cudaFree(scratch_);
  if (stream_) a.cudaStreamDestroy(stream_);
}

}  // namespace distopt::plugins::nccl
