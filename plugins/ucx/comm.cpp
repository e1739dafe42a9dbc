// UcxComm: creation (address exchange through the store), the progress
// thread, failure handling, split.
#include "comm.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "distopt/sdk/fnv1a.hpp"
#include "distopt/sdk/options.hpp"
#include "distopt/sdk/store_split.hpp"

namespace distopt::plugins::ucx {

Config Config::from(const dopt_options* options) {
  Config c;
  if (!options) return c;  // no options object: the schema's defaults
  sdk::OptionsView o(options);
  c.timeout_s = o.get_double("timeout_s");
  c.small_bytes = o.get_int("small_bytes");
  c.segment_bytes = o.get_int("segment_bytes");
  c.peer_errors = o.get_bool("peer_errors");
  c.source_filter = o.get_bool("source_filter");
  c.shm = o.get_bool("shm");
  c.shm_bytes = o.get_int("shm_bytes");
  return c;
}

namespace {

Config config_of(const dopt_create_args& args) {
  if (args.struct_size < DOPT_CREATE_ARGS_STRUCT_SIZE)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "create: dopt_create_args is smaller than v1.0's");
  return Config::from(args.options);
}

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

/// Every rank's worker address, through the store (key <scope>/ucx/addr/<rank>).
std::vector<std::string> exchange_addresses(const dopt_create_args& args, const std::string& scope,
                                            const std::string& mine, double timeout_s) {
  std::vector<std::string> all(args.world_size);
  const std::string base = scope + "/ucx/addr/";
  const std::string value = hex(mine);
  std::string k = base + std::to_string(args.rank);
  if (sdk::host()->store_set(args.store, k.c_str(), value.data(), value.size()) != DOPT_OK)
    throw sdk::Error(DOPT_ERR_COMM, "create: cannot publish the worker address under '" + k + "'");
  for (int p = 0; p < args.world_size; ++p) {
    if (p == args.rank) continue;
    k = base + std::to_string(p);
    std::string buf(4096, '\0');
    size_t len = 0;
    dopt_status st = sdk::host()->store_get(args.store, k.c_str(), buf.data(), buf.size(), &len,
                                            static_cast<int64_t>(timeout_s * 1000));
    if (st == DOPT_OK && len > buf.size()) {
      buf.resize(len);
      st = sdk::host()->store_get(args.store, k.c_str(), buf.data(), buf.size(), &len, 0);
    }
    if (st != DOPT_OK)
      throw sdk::Error(st == DOPT_ERR_TIMEOUT ? DOPT_ERR_TIMEOUT : DOPT_ERR_COMM,
                       "create: rank " + std::to_string(p) +
                           " did not publish its UCX worker address (key '" + k + "')");
    all[p] = unhex(buf.substr(0, len));
  }
  return all;
}

}  // namespace

UcxComm::UcxComm(const dopt_create_args& args) : UcxComm(args, config_of(args)) {}

UcxComm::UcxComm(const dopt_create_args& args, const Config& cfg)
    : rank_(args.rank),
      world_(args.world_size),
      cfg_(cfg),
      store_(args.store),
      scope_(args.scope ? args.scope : "ucx"),
      token_(args.job_token ? args.job_token : ""),
      bind_address_(args.bind_address ? args.bind_address : "") {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw sdk::Error(
        DOPT_ERR_INVALID_ARGUMENT,
        "create: rank " + std::to_string(rank_) + " is not in [0, " + std::to_string(world_) + ")");
  if (world_ > 1 && !store_)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "create: a rendezvous store is required for world_size > 1");
  if (world_ > 0xffff)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, "create: ucx supports at most 65535 ranks");
  const auto comm_id = static_cast<uint8_t>(sdk::Fnv1a().chars(scope_).digest() & 0xff);
  transport_ = std::make_unique<UcpTransport>(rank_, world_, comm_id, cfg_.peer_errors, token_,
                                              cfg_.source_filter);
  std::vector<std::string> addresses(world_);
  if (world_ > 1) {
    addresses = exchange_addresses(args, scope_, transport_->address(), cfg_.timeout_s);
    // Every rank's listeners take the job's hosts before any rank connects.
    transport_->admit(addresses);
    exchange_addresses(args, scope_ + "/admitted", "", cfg_.timeout_s);
  }
  transport_->connect(addresses);
  sdk::p2p::CollectiveOptions co;
  co.small_bytes = static_cast<size_t>(cfg_.small_bytes);
  co.segment_bytes = static_cast<size_t>(cfg_.segment_bytes);
  coll_ = std::make_unique<sdk::p2p::Collectives>(*transport_, co);
  if (world_ > 1) create_shm(args);
  fault_ = sdk::FaultPoint::from_env(rank_);
  transport_->set_fault(&fault_);
  transport_->set_progress_hook([this] { complete_user_ops(); });
  progress_ = std::thread([this] { progress_loop(); });
}

UcxComm::~UcxComm() {
  {
    std::lock_guard<std::mutex> lk(fmu_);
    destroying_ = true;
  }
  std::deque<Op> left;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    stopping_ = true;
    left.swap(queue_);
  }
  aborting_ = true;
  transport_->abort();
  qcv_.notify_all();
  for (auto& op : left)
    op.req->complete(DOPT_ERR_ABORTED, op.req->op() + ": aborted (communicator destroyed)");
  if (progress_.joinable()) progress_.join();
  for (auto& u : user_ops_)
    u.req->complete(DOPT_ERR_ABORTED, u.req->op() + ": aborted (communicator destroyed)");
  user_ops_.clear();
  // The progress thread is gone: this thread owns the (serialized) worker now.
  transport_->close(Clock::now() + std::chrono::seconds(2));
  coll_.reset();
  shm_.reset();
  transport_.reset();
}

void UcxComm::create_shm(const dopt_create_args& args) {
  sdk::shm::Setup ss;
  ss.enabled = cfg_.shm;
  ss.rank = rank_;
  ss.world_size = world_;
  ss.store = args.store;
  ss.scope = scope_;
  ss.segment_bytes = static_cast<size_t>(cfg_.shm_bytes);
  ss.timeout_s = cfg_.timeout_s;
  ss.component = "ucx";
  ss.fallback = "UCX";
  try {
    shm_ = sdk::shm::Collectives::create(ss);
  } catch (const std::exception& e) {
    throw sdk::Error(DOPT_ERR_COMM, "create: rank " + std::to_string(rank_) + ": " + e.what());
  }
}

sdk::shm::WaitCtx UcxComm::shm_ctx(Clock::time_point deadline) {
  sdk::shm::WaitCtx c;
  c.deadline = deadline;
  c.abort = &aborting_;
  c.fault = &fault_;
  c.peer_failed = [this](std::string* why) { return shm_failed_peer(why); };
  return c;
}

int UcxComm::shm_failed_peer(std::string* why) {
  // At most every 5 ms: with more ranks than cores the peer being waited
  // for needs the CPU more than failure detection (which has a 1 s grace).
  const auto t = Clock::now();
  if (t < shm_polled_ + std::chrono::milliseconds(5)) return -1;
  shm_polled_ = t;
  transport_->progress();  // UCP error callbacks, failure notices, user send/recv
  std::string w;
  const int p = transport_->failed_peer(&w);
  if (p < 0) return -1;
  const auto now = Clock::now();
  if (shm_failure_seen_ == Clock::time_point{}) shm_failure_seen_ = now;
  if (now < shm_failure_seen_ + std::chrono::seconds(1)) return -1;  // UcpTransport's grace
  *why = w;
  return p;
}

Clock::time_point UcxComm::deadline() const {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.timeout_s));
}

void UcxComm::fail(dopt_status status, const std::string& cause) {
  std::lock_guard<std::mutex> lk(fmu_);
  if (failed_) return;
  fail_status_ = status;
  fail_cause_ = cause;
  failed_ = true;
  if (!destroying_)
    sdk::log_warn("ucx", "rank " + std::to_string(rank_) + ": communicator failed: " + cause);
}

bool UcxComm::failed(dopt_status* status, std::string* cause) const {
  if (!failed_.load()) return false;
  std::lock_guard<std::mutex> lk(fmu_);
  if (status) *status = fail_status_;
  if (cause) *cause = fail_cause_;
  return true;
}

std::unique_ptr<sdk::Request> UcxComm::enqueue(const std::string& name, Body body) {
  auto req = std::make_shared<sdk::Completion>(name);
  dopt_status st = DOPT_OK;
  std::string cause;
  if (failed(&st, &cause)) {
    req->complete(st, name + ": " + cause);
  } else {
    std::lock_guard<std::mutex> lk(qmu_);
    if (stopping_)
      req->complete(DOPT_ERR_ABORTED, name + ": aborted (communicator destroyed)");
    else
      queue_.push_back(Op{req, std::move(body)});
  }
  qcv_.notify_one();
  return std::make_unique<sdk::CompletionRequest>(req);
}

void UcxComm::progress_loop() {
  while (true) {
    Op op;
    bool have = false;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      // Idle: wake every millisecond to drive UCX (a peer's rendezvous send
      // or close may need this rank's progress); at once with user ops out.
      if (queue_.empty() && !stopping_ && user_ops_.empty() && posts_.empty())
        qcv_.wait_for(lk, std::chrono::milliseconds(1));
      if (stopping_) return;
      if (!queue_.empty()) {
        op = std::move(queue_.front());
        queue_.pop_front();
        have = true;
      }
    }
    if (have)
      run_op(op);
    else if (!transport_->progress() && !user_ops_.empty())
      std::this_thread::yield();
  }
}

void UcxComm::run_op(Op& op) {
  const std::string& name = op.req->op();
  dopt_status st = DOPT_OK;
  std::string cause;
  if (failed(&st, &cause)) {
    op.req->complete(st, name + ": " + cause);
    return;
  }
  const auto t0 = Clock::now();
  const uint64_t sent0 = transport_->bytes_sent() + shm_sent_;
  fault_.begin_op();
  try {
    op.body(deadline());
  } catch (const sdk::Error& e) {
    st = e.status();
    cause = e.what();
  } catch (const std::exception& e) {
    st = DOPT_ERR_INTERNAL;
    cause = e.what();
  }
  sdk::metric_add("comm.seconds", std::chrono::duration<double>(Clock::now() - t0).count());
  sdk::metric_add("comm.bytes_sent",
                  static_cast<double>(transport_->bytes_sent() + shm_sent_ - sent0));
  if (st == DOPT_OK) {
    op.req->complete(DOPT_OK);
    return;
  }
  if (st == DOPT_ERR_ABORTED) {
    op.req->complete(st, name + ": " + cause);
    return;
  }
  fail(st, cause);
  failed(&st, &cause);
  op.req->complete(st, name + ": " + cause);
}

void UcxComm::complete_user_ops() {
  std::deque<std::function<void()>> posts;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    posts.swap(posts_);
  }
  for (auto& post : posts) post();
  const auto now = Clock::now();
  std::string dead;
  const bool peer_failed = transport_->failed_peer(&dead) >= 0;
  for (auto it = user_ops_.begin(); it != user_ops_.end();) {
    dopt_status st = DOPT_OK;
    std::string why;
    try {
      if (transport_->test(it->handle)) {
        it->req->complete(DOPT_OK);
        it = user_ops_.erase(it);
        continue;
      }
      // Still running: a failed peer or the timeout ends it.
      if (peer_failed) {
        st = DOPT_ERR_COMM;
        why = dead;
      } else if (now >= it->deadline) {
        st = DOPT_ERR_TIMEOUT;
        why = "timed out waiting for rank " + std::to_string(it->peer);
      } else {
        ++it;
        continue;
      }
    } catch (const sdk::Error& e) {
      st = e.status();
      why = e.what();
    }
    if (st == DOPT_ERR_COMM || st == DOPT_ERR_TIMEOUT) transport_->cancel(it->handle);
    fail(st, why);
    it->req->complete(st, it->req->op() + ": " + why);
    it = user_ops_.erase(it);
  }
}

Buffer UcxComm::check(const DLTensor& t, const char* op, const char* which, bool reduce_dtype,
                      sdk::DType* dt) const {
  return sdk::host_buffer(t, "ucx", op, which, reduce_dtype, dt);
}

std::unique_ptr<sdk::Communicator> UcxComm::split(int32_t color, int32_t key) {
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
  return std::unique_ptr<sdk::Communicator>(new UcxComm(a, cfg_));
}

}  // namespace distopt::plugins::ucx
