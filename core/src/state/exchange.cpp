#include "state/exchange.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/sdk/base/tensor.hpp"

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

struct ShiftInFlight::Impl {
  dopt_comm_ref comm;
  int rank = 0, world = 1, tag = 0, next = 0, prev = 0;
  std::vector<char> mine, theirs;
  // The first message: [int64 size][the bytes, when at most kInline]; a
  // larger piece follows as a second message.
  static constexpr int64_t kInline = 4096;
  std::vector<char> head_out = std::vector<char>(8 + kInline),
                    head_in = std::vector<char>(8 + kInline);
  int64_t my_size = 0, their_size = 0, head_len = 8 + kInline, n_out = 0, n_in = 0;
  DLTensor size_out{}, size_in{}, bytes_out{}, bytes_in{};
  CommRequest size_sent, size_received, bytes_sent, bytes_received;
  bool finished = false, posted = false;
  std::string to, from;

  // The receive of the bytes, once their size has arrived (once).
  void post_bytes_recv() {
    if (posted) return;
    posted = true;
    std::memcpy(&their_size, head_in.data(), sizeof their_size);
    if (their_size < 0) throw CommError(DOPT_ERR_INTERNAL, "host", from, "bad size");
    n_in = their_size;
    theirs.resize(static_cast<size_t>(n_in));
    if (n_in <= kInline) {
      if (n_in > 0) std::memcpy(theirs.data(), head_in.data() + 8, static_cast<size_t>(n_in));
      return;
    }
    bytes_in = make_dltensor(theirs.data(), n_in, DLDataType{kDLUInt, 8, 1}, &n_in);
    bytes_received = start(comm, from, [&](dopt_request** q) {
      return comm.vt->recv(comm.comm, &bytes_in, prev, tag + 1, q);
    });
  }

  // Everything posted completes (or fails) before the buffers go.
  void wait_all() {
    std::exception_ptr first;
    for (CommRequest* r : {&size_received, &size_sent, &bytes_received, &bytes_sent}) try {
        r->wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    if (first) std::rethrow_exception(first);
  }
};

ShiftInFlight::ShiftInFlight(std::vector<char> mine, const dopt_comm_ref& comm, int rank, int world,
                             int tag)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.comm = comm;
  m.rank = rank;
  m.world = world;
  m.tag = tag;
  m.mine = std::move(mine);
  if (world <= 1) return;
  m.next = (rank + 1) % world;
  m.prev = (rank + world - 1) % world;
  m.to = "send(commit to rank " + std::to_string(m.next) + ")";
  m.from = "recv(commit from rank " + std::to_string(m.prev) + ")";
  m.my_size = static_cast<int64_t>(m.mine.size());
  m.n_out = m.my_size;
  std::memcpy(m.head_out.data(), &m.my_size, sizeof m.my_size);
  if (m.n_out <= Impl::kInline && m.n_out > 0)
    std::memcpy(m.head_out.data() + 8, m.mine.data(), m.mine.size());
  m.size_out = make_dltensor(m.head_out.data(), m.head_len, DLDataType{kDLUInt, 8, 1}, &m.head_len);
  m.size_in = make_dltensor(m.head_in.data(), m.head_len, DLDataType{kDLUInt, 8, 1}, &m.head_len);
  m.size_received = start(comm, m.from, [&](dopt_request** q) {
    return comm.vt->recv(comm.comm, &m.size_in, m.prev, tag, q);
  });
  m.size_sent = start(comm, m.to, [&](dopt_request** q) {
    return comm.vt->send(comm.comm, &m.size_out, m.next, tag, q);
  });
  if (m.n_out > Impl::kInline) {
    m.bytes_out = make_dltensor(m.mine.data(), m.n_out, DLDataType{kDLUInt, 8, 1}, &m.n_out);
    m.bytes_sent = start(comm, m.to, [&](dopt_request** q) {
      return comm.vt->send(comm.comm, &m.bytes_out, m.next, tag + 1, q);
    });
  }
}

std::vector<char> ShiftInFlight::finish() {
  Impl& m = *impl_;
  if (m.finished)
    throw CommError(DOPT_ERR_INVALID_ARGUMENT, "host", "buddy exchange", "finished twice");
  m.finished = true;
  if (m.world <= 1) return std::move(m.mine);
  try {
    m.size_received.wait();
    m.post_bytes_recv();
    m.bytes_received.wait();
  } catch (...) {
    try {
      m.wait_all();
    } catch (...) {
    }
    throw;
  }
  // What this rank received is what counts: a send that failed went to a
  // rank that died (its copy of this rank's state is not needed) or left a
  // live one without it (that rank then fails its own receive).
  try {
    m.wait_all();
  } catch (const std::exception&) {
  }
  return std::move(m.theirs);
}

void ShiftInFlight::progress() {
  if (!impl_ || impl_->finished || impl_->world <= 1 || impl_->posted) return;
  if (impl_->size_received.test()) impl_->post_bytes_recv();
}

bool ShiftInFlight::wait_sent(int64_t timeout_ms) {
  if (!impl_ || impl_->finished) return true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (CommRequest* r : {&impl_->size_sent, &impl_->bytes_sent})
    while (!r->test()) {
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  return true;
}

std::shared_ptr<void> ShiftInFlight::abandon() {
  if (!impl_ || impl_->finished) return nullptr;
  impl_->finished = true;
  for (CommRequest* r :
       {&impl_->size_received, &impl_->size_sent, &impl_->bytes_received, &impl_->bytes_sent})
    *r = CommRequest();  // request_free: the operation goes on
  return std::shared_ptr<Impl>(std::move(impl_));
}

ShiftInFlight::~ShiftInFlight() {
  if (!impl_ || impl_->finished) return;
  try {
    finish();
  } catch (...) {
  }
}

}  // namespace distopt::state
