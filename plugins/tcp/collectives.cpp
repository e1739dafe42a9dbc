// The collectives as ring plans (see ring.hpp for the engine).
//
// Allreduce is a ring reduce-scatter followed by a ring allgather, expressed
// as ONE send stream and ONE receive stream per rank so the two phases and
// all 2(n-1) steps pipeline into each other: whatever was just reduced is
// forwarded to the next rank immediately.
//
// When every rank is on one host (shm_ set at create), allreduce,
// reduce_scatter, allgather and broadcast go over shared memory instead
// (shm_collectives.hpp); send/recv and barrier stay on TCP.
#include <cstring>

#include "comm.hpp"
#include "p2p.hpp"

namespace distopt::plugins::tcp {
namespace {

int mod(int x, int n) { return ((x % n) + n) % n; }

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void check_op(dopt_reduce_op op, const char* name) {
  if (op != DOPT_REDUCE_SUM && op != DOPT_REDUCE_AVG && op != DOPT_REDUCE_MIN &&
      op != DOPT_REDUCE_MAX)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     std::string(name) + ": unknown reduce op " + std::to_string(op));
}

void check_same_dtype(const Buffer& a, const Buffer& b, const char* name) {
  if (a.dtype.code != b.dtype.code || a.dtype.bits != b.dtype.bits ||
      a.dtype.lanes != b.dtype.lanes)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     std::string(name) + ": send and recv have different dtypes");
}

}  // namespace

std::unique_ptr<sdk::Request> TcpComm::allreduce(const DLTensor& send, DLTensor& recv,
                                                 dopt_reduce_op op) {
  check_op(op, "allreduce");
  DType dt;
  Buffer s = check(send, "allreduce", "send", true, &dt);
  Buffer r = check(recv, "allreduce", "recv", true);
  check_same_dtype(s, r, "allreduce");
  if (s.count != r.count)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "allreduce: send has " + std::to_string(s.count) +
                                                    " elements but recv has " +
                                                    std::to_string(r.count));
  return enqueue("allreduce", [this, s, r, dt, op] {
    const int n = world_;
    const size_t N = s.count, esz = s.elem_size;
    RingResult res;
    if (N == 0) return res;
    if (n == 1) {
      divide(dt, r.data, s.data, N, 1);
      return res;
    }
    if (shm_)
      return shm_->allreduce(s.data, r.data, N, dt, op, shm_ctx(deadline_after(cfg_.timeout_s)));
    // Chunk c: elements [c*N/n, (c+1)*N/n), balanced to within one element.
    std::vector<size_t> off(n + 1);
    for (int c = 0; c <= n; ++c) off[c] = (N / n * c + std::min<size_t>(c, N % n)) * esz;
    auto len = [&](int c) { return off[c + 1] - off[c]; };
    const int me = rank_;
    RingPlan p;
    p.send_peer = mod(me + 1, n);
    p.recv_peer = mod(me - 1, n);
    p.dtype = dt;
    p.op = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
    p.sends.push_back({s.data + off[me], len(me)});
    p.send_free = len(me);
    // Reduce-scatter: step k receives chunk me-k-1 and adds this rank's part;
    // the last step's chunk (me+1) is final here (averaged if AVG).
    for (int k = 0; k < n - 1; ++k) {
      int c = mod(me - k - 1, n);
      int div = (k == n - 2 && op == DOPT_REDUCE_AVG) ? n : 1;
      p.recvs.push_back({r.data + off[c], s.data + off[c], len(c), div});
      p.sends.push_back({r.data + off[c], len(c)});  // forwarded next step
    }
    // Allgather: step k receives final chunk me-k; all but the last are forwarded.
    for (int k = 0; k < n - 1; ++k) {
      int c = mod(me - k, n);
      p.recvs.push_back({r.data + off[c], nullptr, len(c), 1});
      if (k < n - 2) p.sends.push_back({r.data + off[c], len(c)});
    }
    return run(p, deadline_after(cfg_.timeout_s));
  });
}

std::unique_ptr<sdk::Request> TcpComm::reduce_scatter(const DLTensor& send, DLTensor& recv,
                                                      dopt_reduce_op op) {
  check_op(op, "reduce_scatter");
  DType dt;
  Buffer s = check(send, "reduce_scatter", "send", true, &dt);
  Buffer r = check(recv, "reduce_scatter", "recv", true);
  check_same_dtype(s, r, "reduce_scatter");
  if (s.count != r.count * static_cast<size_t>(world_))
    throw sdk::Error(
        DOPT_ERR_INVALID_ARGUMENT,
        "reduce_scatter: send has " + std::to_string(s.count) +
            " elements, expected world_size * recv = " + std::to_string(r.count * world_));
  return enqueue("reduce_scatter", [this, s, r, dt, op] {
    const int n = world_, me = rank_;
    const size_t len = r.bytes();
    RingResult res;
    if (len == 0) return res;
    if (n == 1) {
      divide(dt, r.data, s.data, r.count, 1);
      return res;
    }
    if (shm_)
      return shm_->reduce_scatter(s.data, r.data, r.count, dt, op,
                                  shm_ctx(deadline_after(cfg_.timeout_s)));
    // Step k receives block me-k-2; the last step's block is this rank's.
    // Partial sums of earlier steps live in scratch.
    char* tmp = scratch(len * static_cast<size_t>(n > 2 ? n - 2 : 0));
    RingPlan p;
    p.send_peer = mod(me + 1, n);
    p.recv_peer = mod(me - 1, n);
    p.dtype = dt;
    p.op = op == DOPT_REDUCE_AVG ? DOPT_REDUCE_SUM : op;
    p.sends.push_back({s.data + mod(me - 1, n) * len, len});
    p.send_free = len;
    for (int k = 0; k < n - 1; ++k) {
      int b = mod(me - k - 2, n);
      bool last = k == n - 2;
      char* dst = last ? r.data : tmp + static_cast<size_t>(k) * len;
      p.recvs.push_back({dst, s.data + static_cast<size_t>(b) * len, len,
                         (last && op == DOPT_REDUCE_AVG) ? n : 1});
      if (!last) p.sends.push_back({dst, len});
    }
    return run(p, deadline_after(cfg_.timeout_s));
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
    const int n = world_, me = rank_;
    const size_t len = s.bytes();
    RingResult res;
    if (len == 0) return res;
    if (shm_ && n > 1)
      return shm_->allgather(s.data, r.data, len, shm_ctx(deadline_after(cfg_.timeout_s)));
    char* mine = r.data + static_cast<size_t>(me) * len;
    if (mine != s.data) std::memmove(mine, s.data, len);
    if (n == 1) return res;
    RingPlan p;
    p.send_peer = mod(me + 1, n);
    p.recv_peer = mod(me - 1, n);
    p.sends.push_back({mine, len});
    p.send_free = len;
    for (int k = 0; k < n - 1; ++k) {
      char* blk = r.data + static_cast<size_t>(mod(me - k - 1, n)) * len;
      p.recvs.push_back({blk, nullptr, len, 1});
      if (k < n - 2) p.sends.push_back({blk, len});
    }
    return run(p, deadline_after(cfg_.timeout_s));
  });
}

std::unique_ptr<sdk::Request> TcpComm::broadcast(DLTensor& buf, int32_t root) {
  if (root < 0 || root >= world_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) +
                                                    " is not in [0, " + std::to_string(world_) +
                                                    ")");
  Buffer b = check(buf, "broadcast", "buf", false);
  return enqueue("broadcast", [this, b, root] {
    const int n = world_, me = rank_;
    RingResult res;
    if (b.bytes() == 0 || n == 1) return res;
    if (shm_)
      return shm_->broadcast(b.data, b.bytes(), root, shm_ctx(deadline_after(cfg_.timeout_s)));
    // A pipelined chain root -> root+1 -> ... -> root-1: each rank forwards
    // bytes as soon as they arrive.
    const int pos = mod(me - root, n);
    RingPlan p;
    if (pos > 0) {
      p.recv_peer = mod(me - 1, n);
      p.recvs.push_back({b.data, nullptr, b.bytes(), 1});
    }
    if (pos < n - 1) {
      p.send_peer = mod(me + 1, n);
      p.sends.push_back({b.data, b.bytes()});
      p.send_free = pos == 0 ? b.bytes() : 0;
    }
    return run(p, deadline_after(cfg_.timeout_s));
  });
}

std::unique_ptr<sdk::Request> TcpComm::barrier() {
  return enqueue("barrier", [this] {
    // A tiny allreduce: no rank finishes before every rank contributed.
    const int n = world_, me = rank_;
    RingResult res;
    if (n == 1) return res;
    std::vector<int32_t> v(static_cast<size_t>(n), 1);
    const size_t len = sizeof(int32_t);
    char* d = reinterpret_cast<char*>(v.data());
    RingPlan p;
    p.send_peer = mod(me + 1, n);
    p.recv_peer = mod(me - 1, n);
    p.dtype = DType::I32;
    p.sends.push_back({d + me * len, len});
    p.send_free = len;
    for (int k = 0; k < n - 1; ++k) {
      int c = mod(me - k - 1, n);
      p.recvs.push_back({d + c * len, d + c * len, len, 1});
      p.sends.push_back({d + c * len, len});
    }
    for (int k = 0; k < n - 1; ++k) {
      int c = mod(me - k, n);
      p.recvs.push_back({d + c * len, nullptr, len, 1});
      if (k < n - 2) p.sends.push_back({d + c * len, len});
    }
    res = run(p, deadline_after(cfg_.timeout_s));
    for (int c = 0; c < n && res.status == DOPT_OK; ++c)
      if (v[c] != n) {
        res.status = DOPT_ERR_INTERNAL;
        res.why = "barrier: corrupt token from the ring";
      }
    return res;
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
