// TcpComm: creation, the progress thread, failure handling, split.
#include "comm.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "distopt/sdk/options.hpp"
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
  std::unique_ptr<ShmLink> shm;
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
      if (auto c = sdk::shm::Collectives::create(ss)) shm = std::make_unique<ShmLink>(std::move(c));
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
                                               std::function<RingResult()> body) {
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
  RingResult r;
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

RingResult TcpComm::run_p2p(const std::function<void(Clock::time_point)>& body) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(cfg_.timeout_s));
  RingResult res;
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
  auto bad = [&](dopt_status s, const std::string& why) {
    return sdk::Error(s, std::string(op) + ": " + which + " " + why);
  };
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    throw bad(DOPT_ERR_UNSUPPORTED, "is not in host memory (tcp moves host memory only)");
  if (t.ndim < 0 || (t.ndim > 0 && !t.shape))
    throw bad(DOPT_ERR_INVALID_ARGUMENT, "has an invalid shape");
  Buffer b;
  b.dtype = t.dtype;
  size_t bits = static_cast<size_t>(t.dtype.bits) * t.dtype.lanes;
  if (bits == 0 || bits % 8)
    throw bad(DOPT_ERR_UNSUPPORTED, "has a dtype that is not a whole number of bytes");
  b.elem_size = bits / 8;
  if (reduce_dtype) {
    DType d;
    if (!dtype_from_dl(t.dtype, &d))
      throw bad(DOPT_ERR_UNSUPPORTED,
                "dtype is not one of float32, float64, bfloat16, float16, int32, int64");
    if (dt) *dt = d;
  }
  size_t count = 1;
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] < 0) throw bad(DOPT_ERR_INVALID_ARGUMENT, "has a negative dimension");
    if (t.strides && t.shape[i] > 1 && t.strides[i] != expect)
      throw bad(DOPT_ERR_INVALID_ARGUMENT, "is not contiguous");
    expect *= t.shape[i];
    count *= static_cast<size_t>(t.shape[i]);
  }
  b.count = count;
  if (count > 0 && !t.data) throw bad(DOPT_ERR_INVALID_ARGUMENT, "has a NULL data pointer");
  b.data = static_cast<char*>(t.data) + t.byte_offset;
  return b;
}

std::unique_ptr<sdk::Communicator> TcpComm::split(int32_t color, int32_t key) {
  const int seq = split_seq_++;
  const std::string base = scope_ + "/split/" + std::to_string(seq);
  std::string mine = std::to_string(color) + " " + std::to_string(key);
  std::string k = base + "/" + std::to_string(rank_);
  if (world_ > 1 && sdk::host()->store_set(store_, k.c_str(), mine.data(), mine.size()) != DOPT_OK)
    throw sdk::Error(DOPT_ERR_COMM, "split: cannot publish this rank's color under '" + k + "'");
  struct Member {
    int key, rank;
  };
  std::vector<Member> group;
  for (int p = 0; p < world_; ++p) {
    int c = color, kk = key;
    if (p != rank_) {
      std::string pk = base + "/" + std::to_string(p);
      char buf[64];
      size_t len = 0;
      dopt_status st = sdk::host()->store_get(store_, pk.c_str(), buf, sizeof buf - 1, &len,
                                              static_cast<int64_t>(cfg_.timeout_s * 1000));
      if (st != DOPT_OK || len >= sizeof buf)
        throw sdk::Error(
            st == DOPT_ERR_TIMEOUT ? DOPT_ERR_TIMEOUT : DOPT_ERR_COMM,
            "split: rank " + std::to_string(p) + " did not publish its color (key '" + pk + "')");
      buf[len] = 0;
      std::istringstream in(buf);
      in >> c >> kk;
    }
    if (c == color) group.push_back(Member{kk, p});
  }
  if (color < 0) return nullptr;
  std::stable_sort(group.begin(), group.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  int new_rank = 0;
  for (size_t i = 0; i < group.size(); ++i)
    if (group[i].rank == rank_) new_rank = static_cast<int>(i);
  std::string scope = base + "/color" + std::to_string(color);
  dopt_create_args a{};
  a.struct_size = sizeof a;
  a.rank = new_rank;
  a.world_size = static_cast<int32_t>(group.size());
  a.local_rank = new_rank;
  a.local_world_size = a.world_size;
  a.store = store_;
  a.scope = scope.c_str();
  a.job_token = token_.c_str();
  a.bind_address = bind_address_.c_str();
  return std::unique_ptr<sdk::Communicator>(new TcpComm(a, cfg_));
}

}  // namespace distopt::plugins::tcp
