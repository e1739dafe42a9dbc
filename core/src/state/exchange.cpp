#include "state/exchange.hpp"

#include <ATen/ATen.h>

#include <cstring>
#include <deque>

#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "host/services.hpp"

namespace distopt::state {

namespace {

// Start `op` on the communicator; the returned request throws CommError on wait.
template <class F>
CommRequest start(const dopt_comm_ref& c, const std::string& what, F&& op) {
  dopt_request* req = nullptr;
  const dopt_status st = op(&req);
  if (st != DOPT_OK) throw CommError(st, "communicator", what, take_last_error());
  return CommRequest(c.vt, req, "communicator:" + what);
}

}  // namespace

std::vector<int64_t> gather_i64(const dopt_comm_ref& comm, int rank, int world,
                                const std::vector<int64_t>& mine) {
  if (world <= 1) return mine;
  const int64_t k = static_cast<int64_t>(mine.size());
  std::vector<int64_t> all(static_cast<size_t>(k * world), 0);
  std::memcpy(all.data() + rank * k, mine.data(), mine.size() * sizeof(int64_t));
  int64_t shape = static_cast<int64_t>(all.size());
  DLTensor t = make_dltensor(all.data(), shape, DLDataType{kDLInt, 64, 1}, &shape);
  const std::string what = "allreduce(agreement between ranks, SUM)";
  start(comm, what, [&](dopt_request** r) {
    return comm.vt->allreduce(comm.comm, &t, &t, DOPT_REDUCE_SUM, r);
  }).wait();
  return all;
}

std::vector<std::vector<char>> allgather_bytes(std::optional<std::vector<char>> mine,
                                               const dopt_comm_ref& comm, int rank, int world) {
  // -1: this rank has nothing (every rank learns it from the same allreduce).
  const auto sizes =
      gather_i64(comm, rank, world, {mine ? static_cast<int64_t>(mine->size()) : -1});
  std::string failed;
  for (int r = 0; r < world; ++r)
    if (sizes[static_cast<size_t>(r)] < 0)
      failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    throw CheckpointError("add_param_group: rank(s) " + failed +
                          " could not save their optimizer state; the optimizer is unchanged");

  std::vector<std::vector<char>> out(static_cast<size_t>(world));
  out[static_cast<size_t>(rank)] = std::move(*mine);
  if (world <= 1) return out;
  // Received straight into `out`; all broadcasts in flight at once, issued
  // in rank order on every rank.
  std::deque<sdk::DLView> views;
  std::vector<CommRequest> reqs;
  for (int r = 0; r < world; ++r) {
    const int64_t n = sizes[static_cast<size_t>(r)];
    if (n == 0) continue;
    auto& v = out[static_cast<size_t>(r)];
    v.resize(static_cast<size_t>(n));
    views.emplace_back(at::from_blob(v.data(), {n}, at::kByte));
    DLTensor* d = views.back().get();
    reqs.push_back(start(comm, "broadcast(add_param_group state of rank " + std::to_string(r) + ")",
                         [&](dopt_request** q) { return comm.vt->broadcast(comm.comm, d, r, q); }));
  }
  for (auto& q : reqs) q.wait();
  return out;
}

std::vector<char> shift_bytes(const std::vector<char>& mine, const dopt_comm_ref& comm, int rank,
                              int world, int tag) {
  if (world <= 1) return mine;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  int64_t my_size = static_cast<int64_t>(mine.size()), their_size = 0, one = 1;
  DLTensor out = make_dltensor(&my_size, 1, DLDataType{kDLInt, 64, 1}, &one);
  DLTensor in = make_dltensor(&their_size, 1, DLDataType{kDLInt, 64, 1}, &one);
  const std::string to = "send(commit to rank " + std::to_string(next) + ")";
  const std::string from = "recv(commit from rank " + std::to_string(prev) + ")";
  {
    CommRequest r = start(
        comm, from, [&](dopt_request** q) { return comm.vt->recv(comm.comm, &in, prev, tag, q); });
    CommRequest s = start(
        comm, to, [&](dopt_request** q) { return comm.vt->send(comm.comm, &out, next, tag, q); });
    s.wait();
    r.wait();
  }
  std::vector<char> theirs(static_cast<size_t>(their_size));
  int64_t n_out = my_size, n_in = their_size;
  DLTensor bout =
      make_dltensor(const_cast<char*>(mine.data()), n_out, DLDataType{kDLUInt, 8, 1}, &n_out);
  DLTensor bin = make_dltensor(theirs.data(), n_in, DLDataType{kDLUInt, 8, 1}, &n_in);
  CommRequest r, q;
  if (n_in > 0)
    r = start(comm, from,
              [&](dopt_request** x) { return comm.vt->recv(comm.comm, &bin, prev, tag + 1, x); });
  if (n_out > 0)
    q = start(comm, to,
              [&](dopt_request** x) { return comm.vt->send(comm.comm, &bout, next, tag + 1, x); });
  if (n_out > 0) q.wait();
  if (n_in > 0) r.wait();
  return theirs;
}

}  // namespace distopt::state
