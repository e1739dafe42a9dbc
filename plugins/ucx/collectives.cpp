// UcxComm's operations: argument checks on the caller's thread, then, on
// the progress thread, the SDK's shared-memory collectives when every rank
// is on one host (sdk/shm_collectives.hpp; shm_ set at create), else the
// SDK's p2p collectives over UCX (sdk/p2p_collectives.hpp); barrier stays
// on UCX; user send/recv go straight to the transport, tagged Tag::user(tag).
#include <cstring>

#include "comm.hpp"

namespace distopt::plugins::ucx {
namespace {

/// Count what a shm collective handed to peers; throw its failure as sdk::Error.
void finish(const sdk::shm::Result& r, uint64_t* sent) {
  *sent += r.bytes_sent;
  if (r.status != DOPT_OK) throw sdk::Error(r.status, r.why);
}

}  // namespace

std::unique_ptr<sdk::Request> UcxComm::allreduce(const DLTensor& send, DLTensor& recv,
                                                 dopt_reduce_op op) {
  sdk::require_reduce_op(op, "allreduce");
  sdk::DType dt;
  Buffer s = check(send, "allreduce", "send", true, &dt);
  Buffer r = check(recv, "allreduce", "recv", true);
  sdk::require_same_dtype(s, r, "allreduce");
  if (s.count != r.count)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "allreduce: send has " + std::to_string(s.count) +
                                                    " elements but recv has " +
                                                    std::to_string(r.count));
  return enqueue("allreduce", [this, s, r, dt, op](Clock::time_point d) {
    if (shm_)
      finish(shm_->allreduce(s.data, r.data, s.count, dt, op, shm_ctx(d)), &shm_sent_);
    else
      coll_->allreduce(s.data, r.data, s.count, dt, op, d);
  });
}

std::unique_ptr<sdk::Request> UcxComm::reduce_scatter(const DLTensor& send, DLTensor& recv,
                                                      dopt_reduce_op op) {
  sdk::require_reduce_op(op, "reduce_scatter");
  sdk::DType dt;
  Buffer s = check(send, "reduce_scatter", "send", true, &dt);
  Buffer r = check(recv, "reduce_scatter", "recv", true);
  sdk::require_same_dtype(s, r, "reduce_scatter");
  if (s.count != r.count * static_cast<size_t>(world_))
    throw sdk::Error(
        DOPT_ERR_INVALID_ARGUMENT,
        "reduce_scatter: send has " + std::to_string(s.count) +
            " elements, expected world_size * recv = " + std::to_string(r.count * world_));
  return enqueue("reduce_scatter", [this, s, r, dt, op](Clock::time_point d) {
    if (shm_)
      finish(shm_->reduce_scatter(s.data, r.data, r.count, dt, op, shm_ctx(d)), &shm_sent_);
    else
      coll_->reduce_scatter(s.data, r.data, r.count, dt, op, d);
  });
}

std::unique_ptr<sdk::Request> UcxComm::allgather(const DLTensor& send, DLTensor& recv) {
  Buffer s = check(send, "allgather", "send", false);
  Buffer r = check(recv, "allgather", "recv", false);
  sdk::require_same_dtype(s, r, "allgather");
  if (r.bytes() != s.bytes() * static_cast<size_t>(world_))
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "allgather: recv has " + std::to_string(r.bytes()) +
                                                    " bytes, expected world_size * send = " +
                                                    std::to_string(s.bytes() * world_));
  return enqueue("allgather", [this, s, r](Clock::time_point d) {
    if (shm_)
      finish(shm_->allgather(s.data, r.data, s.bytes(), shm_ctx(d)), &shm_sent_);
    else
      coll_->allgather(s.data, r.data, s.bytes(), d);
  });
}

std::unique_ptr<sdk::Request> UcxComm::broadcast(DLTensor& buf, int32_t root) {
  if (root < 0 || root >= world_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) +
                                                    " is not in [0, " + std::to_string(world_) +
                                                    ")");
  Buffer b = check(buf, "broadcast", "buf", false);
  return enqueue("broadcast", [this, b, root](Clock::time_point d) {
    if (shm_)
      finish(shm_->broadcast(b.data, b.bytes(), root, shm_ctx(d)), &shm_sent_);
    else
      coll_->broadcast(b.data, b.bytes(), root, d);
  });
}

std::unique_ptr<sdk::Request> UcxComm::barrier() {
  return enqueue("barrier", [this](Clock::time_point d) { coll_->barrier(d); });
}

std::unique_ptr<sdk::Request> UcxComm::post_user(const std::string& name, bool is_send, int peer,
                                                 int32_t tag, const Buffer& b) {
  if (peer < 0 || peer >= world_ || peer == rank_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, name + ": peer " + std::to_string(peer) +
                                                    " is not another rank in [0, " +
                                                    std::to_string(world_) + ")");
  if (tag < 0)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, name + ": tag " + std::to_string(tag) + " < 0");
  auto req = std::make_shared<sdk::Completion>(name);
  dopt_status st = DOPT_OK;
  std::string cause;
  if (failed(&st, &cause)) {
    req->complete(st, name + ": " + cause);
    return std::make_unique<sdk::CompletionRequest>(req);
  }
  {
    std::lock_guard<std::mutex> lk(qmu_);
    if (stopping_) {
      req->complete(DOPT_ERR_ABORTED, name + ": aborted (communicator destroyed)");
      return std::make_unique<sdk::CompletionRequest>(req);
    }
    posts_.push_back([this, req, is_send, peer, tag, b] {
      const uint64_t t = sdk::p2p::Tag::user(static_cast<uint32_t>(tag));
      Handle h = is_send ? transport_->isend(peer, t, b.data, b.bytes())
                         : transport_->irecv(peer, t, b.data, b.bytes());
      user_ops_.push_back(UserOp{req, h, peer, deadline()});
    });
  }
  qcv_.notify_one();
  return std::make_unique<sdk::CompletionRequest>(req);
}

std::unique_ptr<sdk::Request> UcxComm::send(const DLTensor& buf, int32_t peer, int32_t tag) {
  return post_user("send", true, peer, tag, check(buf, "send", "buf", false));
}

std::unique_ptr<sdk::Request> UcxComm::recv(DLTensor& buf, int32_t peer, int32_t tag) {
  return post_user("recv", false, peer, tag, check(buf, "recv", "buf", false));
}

}  // namespace distopt::plugins::ucx
