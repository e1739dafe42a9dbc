// TcpComm: creation, the progress thread, failure handling, split.
#include "comm.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "distopt/sdk/options.hpp"
#include "distopt/sdk/store_split.hpp"
#include "p2p.hpp"

namespace distopt::plugins::tcp {

Config Config::from(const dopt_options* options) {
  Config c;
  if (!options) return c;  // no options object: the schema's defaults
  sdk::OptionsView o(options);
  c.timeout_s = o.get_double("timeout_s");
  c.chunk_bytes = o.get_int("chunk_bytes");
  c.socket_buffer_bytes = o.get_int("socket_buffer_bytes");
  c.max_io_bytes = o.get_int("max_io_bytes");
  c.shm = o.get_bool("shm");
  c.shm_bytes = o.get_int("shm_bytes");
  return c;
}

namespace {
// The host's args, checked to be as large as ABI 1.0's before options is read.
Config config_of(const dopt_create_args& args) {
  if (args.struct_size < DOPT_CREATE_ARGS_STRUCT_SIZE)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "create: dopt_create_args is smaller than v1.0's");
  return Config::from(args.options);
}
}  // namespace

TcpComm::TcpComm(const dopt_create_args& args) : TcpComm(args, config_of(args)) {}

TcpComm::TcpComm(const dopt_create_args& args, const Config& cfg)
    : TcpComm(args, cfg, connect(args, cfg)) {}

TcpComm::Links TcpComm::connect(const dopt_create_args& args, const Config& cfg) {
  if (args.world_size < 1 || args.rank < 0 || args.rank >= args.world_size)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "create: rank " + std::to_string(args.rank) +
                                                    " is not in [0, " +
                                                    std::to_string(args.world_size) + ")");
  if (args.world_size > 1 && !args.store)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "create: a rendezvous store is required for world_size > 1");
  MeshArgs m;
  m.rank = args.rank;
  m.world_size = args.world_size;
  m.store = args.store;
  m.scope = args.scope ? args.scope : "tcp";
  m.token = args.job_token ? args.job_token : "";
  m.bind_address = args.bind_address && *args.bind_address ? args.bind_address : "127.0.0.1";
  m.sockets.buffer_bytes = cfg.socket_buffer_bytes;
  m.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(cfg.timeout_s));
  Mesh mesh;
  try {
    mesh = build_mesh(m);
  } catch (const std::exception& e) {
    throw sdk::Error(DOPT_ERR_COMM,
                     std::string("create: rank ") + std::to_string(args.rank) + ": " + e.what());
  }
  std::unique_ptr<sdk::shm::Collectives> shm;
  try {
    if (args.world_size > 1) {
      sdk::shm::Setup ss;
      ss.enabled = cfg.shm;
      ss.rank = args.rank;
      ss.world_size = args.world_size;
      ss.store = args.store;
      ss.scope = m.scope;
      ss.segment_bytes = static_cast<size_t>(cfg.shm_bytes);
      ss.timeout_s = cfg.timeout_s;
      ss.component = "tcp";
      ss.fallback = "TCP";
      shm = sdk::shm::Collectives::create(ss);
    }
  } catch (const std::exception& e) {
    mesh.close_all();
    throw sdk::Error(DOPT_ERR_COMM,
                     std::string("create: rank ") + std::to_string(args.rank) + ": " + e.what());
  }
  return Links{std::move(mesh), std::move(shm)};
}

TcpComm::TcpComm(const dopt_create_args& args, const Config& cfg, Links links)
    : rank_(args.rank),
      world_(args.world_size),
      cfg_(cfg),
      store_(args.store),
      scope_(args.scope ? args.scope : "tcp"),
      token_(args.job_token ? args.job_token : ""),
      bind_address_(args.bind_address && *args.bind_address ? args.bind_address : "127.0.0.1"),
      mesh_(std::move(links.mesh)),
      shm_(std::move(links.shm)) {
  try {
    fault_ = FaultPoint::from_env(rank_);
    abort_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (abort_fd_ < 0) throw sdk::Error(DOPT_ERR_INTERNAL, "create: eventfd failed");
    SocketTransport::Options to;
    to.max_io = static_cast<size_t>(std::max<int64_t>(cfg_.max_io_bytes, 4096));
    to.abort = &aborting_;
    to.destroy = &destroying_now_;
    to.abort_fd = abort_fd_;
    to.fault = &fault_;
    transport_ = std::make_unique<SocketTransport>(rank_, mesh_.out, mesh_.in, to);
    sdk::p2p::CollectiveOptions co;
    co.segment_bytes = static_cast<size_t>(std::max<int64_t>(cfg_.chunk_bytes, 4096));
    coll_ = std::make_unique<sdk::p2p::Collectives>(*transport_, co);
    control_ = std::make_unique<Control>(this, rank_, mesh_.ctrl);
    progress_ = std::thread([this] { progress_loop(); });
  } catch (...) {
    control_.reset();  // stops its thread before the sockets close
    mesh_.close_all();
    if (abort_fd_ >= 0) close(abort_fd_);
    throw;
  }
}

TcpComm::~TcpComm() {
  {
    std::lock_guard<std::mutex> lk(fmu_);
    destroying_ = true;
  }
  // Abort the running operation and everything queued behind it.
  std::deque<Op> left;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    stopping_ = true;
    left.swap(queue_);
  }
  destroying_now_ = true;
  aborting_ = true;
  uint64_t one = 1;
  (void)!write(abort_fd_, &one, sizeof one);
  qcv_.notify_all();
  for (auto& op : left)
    op.req->complete(DOPT_ERR_ABORTED, op.req->op() + ": aborted (communicator destroyed)");
  if (progress_.joinable()) progress_.join();
  control_->stop();  // goodbye to the peers, then they may see our sockets close
  control_.reset();
  mesh_.close_all();
  close(abort_fd_);
}

void TcpComm::fail(dopt_status status, const std::string& cause, bool notify_peers) {
  // A timeout seen here: say which peers went silent (a cut link sends no
  // EOF), as the peer waited on may itself be waiting on one of them.
  std::string why = cause;
  if (status == DOPT_ERR_TIMEOUT && notify_peers && control_) {
    const std::string silent = control_->silence();
    if (!silent.empty()) why += "; " + silent;
  }
  {
    std::lock_guard<std::mutex> lk(fmu_);
    if (failed_) return;
    fail_status_ = status;
    fail_cause_ = why;
    failed_ = true;
    if (!destroying_)
      sdk::log_warn("tcp",
                    "rank " + std::to_string(rank_) + ": communicator failed: " + fail_cause_);
  }
  aborting_ = true;
  uint64_t one = 1;
  (void)!write(abort_fd_, &one, sizeof one);
  if (control_) control_->on_failure(status, why, notify_peers);
}

bool TcpComm::failed(dopt_status* status, std::string* cause) const {
  if (!failed_.load()) return false;
  std::lock_guard<std::mutex> lk(fmu_);
  if (status) *status = fail_status_;
  if (cause) *cause = fail_cause_;
  return true;
}

std::unique_ptr<sdk::Request> TcpComm::request(std::shared_ptr<sdk::Completion> c) {
  // No default timeout: a wait with timeout_ms < 0 waits for the operation,
  // which itself fails after timeout_s.
  return std::make_unique<sdk::CompletionRequest>(std::move(c));
}

std::unique_ptr<sdk::Request> TcpComm::enqueue(const std::string& name,
                                               std::function<OpResult()> body) {
  auto req = std::make_shared<sdk::Completion>(name);
  dopt_status st = DOPT_OK;
  std::string cause;
  if (failed(&st, &cause)) {
    req->complete(st, name + ": " + cause);
    return request(req);
  }
  {
    std::lock_guard<std::mutex> lk(qmu_);
    if (stopping_) {
      req->complete(DOPT_ERR_ABORTED, name + ": aborted (communicator destroyed)");
      return request(req);
    }
    queue_.push_back(Op{req, std::move(body)});
  }
  qcv_.notify_one();
  return request(req);
}

void TcpComm::progress_loop() {
  while (true) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      qcv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    run_op(op);
  }
}

void TcpComm::run_op(Op& op) {
  const std::string& name = op.req->op();
  dopt_status st = DOPT_OK;
  std::string cause;
  if (failed(&st, &cause)) {
    op.req->complete(st, name + ": " + cause);
    return;
  }
  auto t0 = Clock::now();
  fault_.begin_op();
  OpResult r;
  try {
    r = op.body();
  } catch (const std::exception& e) {
    r.status = DOPT_ERR_INTERNAL;
    r.why = e.what();
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  sdk::metric_add("comm.seconds", secs);
  if (r.bytes_sent) sdk::metric_add("comm.bytes_sent", static_cast<double>(r.bytes_sent));
  if (r.bytes_received)
    sdk::metric_add("comm.bytes_received", static_cast<double>(r.bytes_received));
  if (r.status >= 0) {
    op.req->complete(DOPT_OK);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(fmu_);
    if (destroying_) {
      op.req->complete(DOPT_ERR_ABORTED, name + ": aborted (communicator destroyed)");
      return;
    }
  }
  if (r.status == DOPT_ERR_COMM && r.peer >= 0) {
    // A data connection broke. The control channel knows why (the peer died,
    // aborted because a third rank died, or closed the communicator): give it
    // a moment to say so, so the message names the rank that really failed.
    auto until = Clock::now() + std::chrono::seconds(2);
    while (!failed_.load() && !control_->said_bye(r.peer) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!failed_.load() && control_->said_bye(r.peer))
      r.why = "rank " + std::to_string(r.peer) + " closed the communicator";
  }
  fail(r.status == DOPT_ERR_ABORTED ? DOPT_ERR_COMM : r.status, r.why, true);
  failed(&st, &cause);
  op.req->complete(st, name + ": " + cause);
}

ShmWaitCtx TcpComm::shm_ctx(Clock::time_point deadline) {
  ShmWaitCtx c;
  c.deadline = deadline;
  c.abort = &aborting_;
  c.fault = &fault_;
  c.peer_left = control_ ? control_->bye_flags() : nullptr;  // a peer's goodbye
  return c;
}

OpResult TcpComm::run_p2p(const std::function<void(Clock::time_point)>& body) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(cfg_.timeout_s));
  OpResult res;
  try {
    body(deadline);
  } catch (const sdk::Error& e) {
    res.status = e.status();
    res.why = e.what();
    if (res.status == DOPT_ERR_COMM) res.peer = transport_->failed_peer();
  }
  transport_->take_bytes(&res.bytes_sent, &res.bytes_received);
  return res;
}

Buffer TcpComm::check(const DLTensor& t, const char* op, const char* which, bool reduce_dtype,
                      DType* dt) const {
  return sdk::host_buffer(t, "tcp", op, which, reduce_dtype, dt);
}

std::unique_ptr<sdk::Communicator> TcpComm::split(int32_t color, int32_t key) {
  const sdk::StoreSplit sp = sdk::split_through_store(store_, scope_, split_seq_++, rank_, world_,
                                                      color, key, cfg_.timeout_s);
  if (!sp.member) return nullptr;
  dopt_create_args a{};
  a.struct_size = sizeof a;
  a.rank = sp.rank;
  a.world_size = sp.world_size;
  a.local_rank = sp.rank;
  a.local_world_size = sp.world_size;
  a.store = store_;
  a.scope = sp.scope.c_str();
  a.job_token = token_.c_str();
  a.bind_address = bind_address_.c_str();
  return std::unique_ptr<sdk::Communicator>(new TcpComm(a, cfg_));
}

}  // namespace distopt::plugins::tcp
