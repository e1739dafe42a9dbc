// TcpComm's operations: argument checks on the caller's thread, then, on
// the progress thread, the SDK's p2p collectives (sdk/p2p_collectives.hpp:
// recursive doubling / direct exchange for small vectors, a segmented ring
// for large ones) over the mesh's data connections (SocketTransport).
//
// When every rank is on one host (shm_ set at create), allreduce,
// reduce_scatter, allgather and broadcast go over shared memory instead
// (sdk/shm_collectives.hpp); send/recv and barrier stay on TCP.

#include "comm.hpp"
#include "p2p.hpp"

namespace distopt::plugins::tcp {
namespace {

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

std::unique_ptr<sdk::Request> TcpComm::allreduce(const DLTensor& send, DLTensor& recv,
                                                 dopt_reduce_op op) {
  sdk::require_reduce_op(op, "allreduce");
  DType dt;
  Buffer s = check(send, "allreduce", "send", true, &dt);
  Buffer r = check(recv, "allreduce", "recv", true);
  sdk::require_same_dtype(s, r, "allreduce");
  if (s.count != r.count)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "allreduce: send has " + std::to_string(s.count) +
                                                    " elements but recv has " +
                                                    std::to_string(r.count));
  return enqueue("allreduce", [this, s, r, dt, op] {
    const int n = world_;
    const size_t N = s.count;
    OpResult res;
    if (N == 0) return res;
    if (n == 1) {
      sdk::divide(dt, r.data, s.data, N, 1);
      return res;
    }
    if (shm_)
      return shm_->allreduce(s.data, r.data, N, dt, op, shm_ctx(deadline_after(cfg_.timeout_s)));
    return run_p2p([&](Clock::time_point d) { coll_->allreduce(s.data, r.data, N, dt, op, d); });
  });
}

std::unique_ptr<sdk::Request> TcpComm::reduce_scatter(const DLTensor& send, DLTensor& recv,
                                                      dopt_reduce_op op) {
  sdk::require_reduce_op(op, "reduce_scatter");
  DType dt;
  Buffer s = check(send, "reduce_scatter", "send", true, &dt);
  Buffer r = check(recv, "reduce_scatter", "recv", true);
  sdk::require_same_dtype(s, r, "reduce_scatter");
  if (s.count != r.count * static_cast<size_t>(world_))
    throw sdk::Error(
        DOPT_ERR_INVALID_ARGUMENT,
        "reduce_scatter: send has " + std::to_string(s.count) +
            " elements, expected world_size * recv = " + std::to_string(r.count * world_));
  return enqueue("reduce_scatter", [this, s, r, dt, op] {
    const int n = world_;
    const size_t len = r.bytes();
    OpResult res;
    if (len == 0) return res;
    if (n == 1) {
      sdk::divide(dt, r.data, s.data, r.count, 1);
      return res;
    }
    if (shm_)
      return shm_->reduce_scatter(s.data, r.data, r.count, dt, op,
                                  shm_ctx(deadline_after(cfg_.timeout_s)));
    return run_p2p(
        [&](Clock::time_point d) { coll_->reduce_scatter(s.data, r.data, r.count, dt, op, d); });
  });
}

std::unique_ptr<sdk::Request> TcpComm::allgather(const DLTensor& send, DLTensor& recv) {
  Buffer s = check(send, "allgather", "send", false);
  Buffer r = check(recv, "allgather", "recv", false);
  if (s.bytes() * static_cast<size_t>(world_) != r.bytes())
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "allgather: recv has " + std::to_string(r.bytes()) +
                                                    " bytes, expected world_size * send = " +
                                                    std::to_string(s.bytes() * world_));
  return enqueue("allgather", [this, s, r] {
    const int n = world_;
    const size_t len = s.bytes();
    OpResult res;
    if (len == 0) return res;
    if (shm_ && n > 1)
      return shm_->allgather(s.data, r.data, len, shm_ctx(deadline_after(cfg_.timeout_s)));
    return run_p2p([&](Clock::time_point d) { coll_->allgather(s.data, r.data, len, d); });
  });
}

std::unique_ptr<sdk::Request> TcpComm::broadcast(DLTensor& buf, int32_t root) {
  if (root < 0 || root >= world_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) +
                                                    " is not in [0, " + std::to_string(world_) +
                                                    ")");
  Buffer b = check(buf, "broadcast", "buf", false);
  return enqueue("broadcast", [this, b, root] {
    const int n = world_;
    OpResult res;
    if (b.bytes() == 0 || n == 1) return res;
    if (shm_)
      return shm_->broadcast(b.data, b.bytes(), root, shm_ctx(deadline_after(cfg_.timeout_s)));
    return run_p2p([&](Clock::time_point d) { coll_->broadcast(b.data, b.bytes(), root, d); });
  });
}

std::unique_ptr<sdk::Request> TcpComm::barrier() {
  return enqueue("barrier", [this] {
    OpResult res;
    if (world_ == 1) return res;
    return run_p2p([&](Clock::time_point d) { coll_->barrier(d); });
  });
}

std::unique_ptr<sdk::Request> TcpComm::send(const DLTensor& buf, int32_t peer, int32_t tag) {
  if (peer < 0 || peer >= world_ || peer == rank_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "send: peer " + std::to_string(peer) +
                                                    " is not another rank in [0, " +
                                                    std::to_string(world_) + ")");
  Buffer b = check(buf, "send", "buf", false);
  auto req = std::make_shared<sdk::Completion>("send");
  dopt_status st;
  std::string cause;
  if (failed(&st, &cause))
    req->complete(st, "send: " + cause);
  else
    control_->post_send(peer, tag, b.data, b.bytes(), req);
  return request(req);
}

std::unique_ptr<sdk::Request> TcpComm::recv(DLTensor& buf, int32_t peer, int32_t tag) {
  if (peer < 0 || peer >= world_ || peer == rank_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "recv: peer " + std::to_string(peer) +
                                                    " is not another rank in [0, " +
                                                    std::to_string(world_) + ")");
  Buffer b = check(buf, "recv", "buf", false);
  auto req = std::make_shared<sdk::Completion>("recv");
  dopt_status st;
  std::string cause;
  if (failed(&st, &cause))
    req->complete(st, "recv: " + cause);
  else
    control_->post_recv(peer, tag, b.data, b.bytes(), req);
  return request(req);
}

}  // namespace distopt::plugins::tcp
