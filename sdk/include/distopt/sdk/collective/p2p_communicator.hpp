// A host-memory communicator for any p2p::Transport (p2p_transport.hpp):
// everything but the transport and its connection set-up. A communicator
// over a new transport (tcp sockets, UCX, RDMA verbs, a test transport)
// derives from P2PCommunicator, connects its transport in its constructor,
// calls start(), and implements split_child(); the shell supplies
//   - the checks of every operation's arguments (on the caller's thread),
//   - the operation queue and the progress thread that runs collectives in
//     issue order, timing each against timeout_s,
//   - the collectives: the SDK's shared-memory ones (shm_collectives.hpp)
//     when every rank is on one host and shm is on, else the SDK's p2p ones
//     (p2p_collectives.hpp) over the transport; barrier always over the
//     transport,
//   - user send/recv as tagged transport messages (p2p::Tag::user), posted
//     and completed by the progress thread,
//   - the first-failure state (every later operation fails with it at once),
//     abort of pending work on destruction, split through the store, the
//     comm.* metrics, and the option specs the shell reads (timeout_s, shm,
//     shm_bytes, shm_stores).
// The virtual hooks below let a transport add what only it knows (a side
// channel that names a dead peer, a wake-up fd, progress while idle).
// Header-only, torch-free.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "distopt/sdk/base/fault_point.hpp"
#include "distopt/sdk/base/options.hpp"
#include "distopt/sdk/base/plugin.hpp"
#include "distopt/sdk/collective/host_buffer.hpp"
#include "distopt/sdk/collective/p2p_collectives.hpp"
#include "distopt/sdk/collective/shm_collectives.hpp"
#include "distopt/sdk/collective/store_split.hpp"
#include "distopt/sdk/transport/p2p_transport.hpp"

namespace distopt::sdk::p2p {

/// The options the shell reads; a component's own Config derives from it
/// and adds `void read_own(const OptionsView&)` for its own keys.
struct ShellConfig {
  double timeout_s = 60;        ///< seconds any operation (and connecting) may take
  bool shm = true;              ///< shared-memory collectives when all ranks share a host
  int64_t shm_bytes = 1 << 20;  ///< per-rank shared segment (two slots)
  shm::Stores shm_stores = shm::Stores::automatic;  ///< how a rank writes into its segment
};

/// The component's Config from the host's args: the schema's defaults
/// without an options object, else the shell's keys (timeout_s, shm,
/// shm_bytes, shm_stores: the option specs below; shm_stores is "auto" where
/// the schema lacks it) and Config::read_own's. Checks first
/// that the args are at least ABI 1.0's. Throws sdk::Error(INVALID_ARGUMENT).
template <class Config>
Config config_of(const dopt_create_args& args) {
  if (args.struct_size < DOPT_CREATE_ARGS_STRUCT_SIZE)
    throw Error(DOPT_ERR_INVALID_ARGUMENT, "create: dopt_create_args is smaller than v1.0's");
  Config c;
  if (!args.options) return c;
  const OptionsView o(args.options);
  c.timeout_s = o.get_double("timeout_s");
  c.shm = o.get_bool("shm");
  c.shm_bytes = o.get_int("shm_bytes");
  // Optional in a schema: components built on SDKs before it list only the
  // three above.
  std::string stores = "auto";
  try {
    stores = o.get_string("shm_stores");
  } catch (const Error&) {
    set_error("");  // the host recorded the failed lookup; it is no error here
  }
  if (!shm::parse_stores(stores, &c.shm_stores))
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                "option 'shm_stores': '" + stores + "' is not one of auto, plain, streaming");
  c.read_own(o);
  return c;
}

// The option specs of ShellConfig, for a component's schema table.
constexpr OptionDecl timeout_option() {
  return option_double("timeout_s", "60",
                       "seconds any operation (and connecting) may take before it fails with "
                       "TIMEOUT")
      .range(0.001, 1e7);
}
constexpr OptionDecl shm_option() {
  return option_bool(
      "shm", "true",
      "run allreduce, reduce_scatter, allgather and broadcast over distopt's "
      "shared-memory transport (sdk/collective/shm_collectives.hpp) when every rank is on "
      "one host (the network if any rank says false); send/recv and barrier stay "
      "on the network");
}
constexpr OptionDecl shm_bytes_option() {
  return option_int("shm_bytes", "1048576",
                    "shared-memory segment per rank (two slots that tensors stream through)")
      .range(65536, 1 << 30);
}
constexpr OptionDecl shm_stores_option() {
  return option_string("shm_stores", "auto",
                       "how a rank writes tensors into its shared-memory segment: plain stores "
                       "(peers read them from its cache), streaming (non-temporal) stores, or "
                       "auto: whichever has copied faster lately, measured as it runs")
      .choices("auto|plain|streaming");
}

/// What the shell needs to know of the component.
struct ShellSetup {
  const char* component = "p2p";         ///< "tcp": messages, log, metrics' owner
  const char* fallback = "the network";  ///< logged when shm is not used ("TCP")
  const char* default_scope = "p2p";     ///< store key prefix when args.scope is null
  const char* default_bind = "";         ///< bind_address when args has none ("127.0.0.1")
  /// Progress thread while idle: true drives the transport every millisecond
  /// (idle_progress(); UCX needs it for a peer's rendezvous send or close),
  /// false sleeps until work arrives.
  bool poll_when_idle = false;
  /// A shared-memory allreduce of at most this many bytes runs on the
  /// calling thread when nothing is queued or running here and every peer
  /// arrives at an allreduce of the same size within about 50 us (0:
  /// never); otherwise the progress thread runs it as any other. Thread
  /// hand-offs cost more than a small collective (5-60 us on a VM against
  /// 1-2 us at 4 KiB, 2 ranks), and a progress thread woken next to its
  /// caller shares that core with it (512 KiB-2 MiB at a third of the
  /// rate). The request is then complete on return. Only for a transport
  /// whose add_wait_signals() reads nothing but atomics (tcp): the
  /// progress thread keeps driving user send/recv beside it.
  size_t inline_shm_bytes = 0;
};

/// One rank's endpoint. Requests are sdk::CompletionRequests named after the
/// operation; a failed operation completes with "<op>: <cause>" (e.g.
/// "allreduce: rank 2: connection lost (...)"); the first failure is
/// permanent. Public methods are thread-safe (the host calls them from the
/// training and autograd threads); tensors must be host memory
/// (sdk/collective/host_buffer.hpp) and stay valid until their request completes.
class P2PCommunicator : public Communicator {
 public:
  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_; }

  // Each checks its arguments (throws sdk::Error INVALID_ARGUMENT or
  // UNSUPPORTED naming the operation and argument) and returns a started
  // request. Semantics: distopt/communicator.h.
  std::unique_ptr<Request> allreduce(const DLTensor& send, DLTensor& recv, dopt_reduce_op op) final;
  std::unique_ptr<Request> reduce_scatter(const DLTensor& send, DLTensor& recv,
                                          dopt_reduce_op op) final;
  std::unique_ptr<Request> allgather(const DLTensor& send, DLTensor& recv) final;
  std::unique_ptr<Request> broadcast(DLTensor& buf, int32_t root) final;
  std::unique_ptr<Request> barrier() final;
  std::unique_ptr<Request> send(const DLTensor& buf, int32_t peer, int32_t tag) final;
  std::unique_ptr<Request> recv(DLTensor& buf, int32_t peer, int32_t tag) final;
  /// Blocking, collective (through the store); nullptr for color < 0.
  /// Throws sdk::Error.
  std::unique_ptr<Communicator> split(int32_t color, int32_t key) final;

  /// Record the first failure (later ones are ignored, as are all during
  /// destruction's abort): every pending and future operation completes
  /// with `status` and "<op>: <cause>". Then on_failure(). Thread-safe.
  void fail(dopt_status status, const std::string& cause, bool notify_peers = true) {
    const std::string why = describe_failure(status, cause, notify_peers);
    {
      std::lock_guard<std::mutex> lk(fmu_);
      if (failed_) return;
      fail_status_ = status;
      fail_cause_ = why;
      failed_ = true;
      if (!destroying_)
        log_warn(setup_.component,
                 "rank " + std::to_string(rank_) + ": communicator failed: " + why);
    }
    on_failure(status, why, notify_peers);
  }
  /// The recorded failure, if any. Thread-safe.
  bool failed(dopt_status* status, std::string* cause) const {
    if (!failed_.load()) return false;
    std::lock_guard<std::mutex> lk(fmu_);
    if (status) *status = fail_status_;
    if (cause) *cause = fail_cause_;
    return true;
  }
  double timeout_s() const { return cfg_.timeout_s; }

 protected:
  using Result = shm::Result;  ///< an operation's outcome: status, why, failed peer, bytes

  /// Checks the rank and the store (INVALID_ARGUMENT naming them); reads
  /// nothing else. The derived constructor then connects and calls start().
  P2PCommunicator(const dopt_create_args& args, const ShellConfig& cfg, ShellSetup setup)
      : setup_(setup),
        rank_(args.rank),
        world_(args.world_size),
        cfg_(cfg),
        store_(args.store),
        prefix_(args.scope ? args.scope : setup.default_scope),
        token_(args.job_token ? args.job_token : ""),
        bind_address_(args.bind_address && *args.bind_address ? args.bind_address
                                                              : setup.default_bind) {
    if (world_ < 1 || rank_ < 0 || rank_ >= world_)
      throw Error(DOPT_ERR_INVALID_ARGUMENT, "create: rank " + std::to_string(rank_) +
                                                 " is not in [0, " + std::to_string(world_) + ")");
    if (world_ > 1 && !store_)
      throw Error(DOPT_ERR_INVALID_ARGUMENT,
                  "create: a rendezvous store is required for world_size > 1");
    fault_ = FaultPoint::from_env(rank_);
  }
  /// Joins the progress thread if the derived destructor did not (it must,
  /// with shutdown(), before it destroys the transport).
  ~P2PCommunicator() override { shutdown(); }

  /// Collective, after the transport is connected (it must outlive the
  /// progress thread): the shared-memory collectives through the store
  /// (world > 1; null on any rank disables them on all), the p2p collectives
  /// over `t`, then the progress thread. Throws sdk::Error(COMM) naming the
  /// rank when the store handshake fails.
  void start(Transport& t, CollectiveOptions co) {
    transport_ = &t;
    if (world_ > 1) {
      shm::Setup ss;
      ss.enabled = cfg_.shm;
      ss.rank = rank_;
      ss.world_size = world_;
      ss.store = store_;
      ss.scope = prefix_;
      ss.segment_bytes = static_cast<size_t>(cfg_.shm_bytes);
      ss.stores = cfg_.shm_stores;
      ss.timeout_s = cfg_.timeout_s;
      ss.component = setup_.component;
      ss.fallback = setup_.fallback;
      try {
        shm_ = shm::Collectives::create(ss);
      } catch (const std::exception& e) {
        throw Error(DOPT_ERR_COMM, "create: rank " + std::to_string(rank_) + ": " + e.what());
      }
    }
    coll_ = std::make_unique<Collectives>(t, co);
    progress_ = std::thread([this] { progress_loop(); });
  }

  /// Destruction's first half, from the derived destructor before it tears
  /// down the transport: marks the communicator destroyed, sets the abort
  /// flags, wake_transport(), completes queued operations and user
  /// send/recv with DOPT_ERR_ABORTED ("<op>: aborted (communicator
  /// destroyed)") and joins the progress thread. Idempotent.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(fmu_);
      destroying_ = true;
    }
    std::deque<Op> left;
    {
      std::lock_guard<std::mutex> lk(qmu_);
      if (stopping_) return;
      stopping_ = true;
      left.swap(queue_);
    }
    destroying_now_ = true;
    aborting_ = true;
    wake_transport();
    qcv_.notify_all();
    for (auto& op : left) op.req->complete(DOPT_ERR_ABORTED, aborted(op.req->op()));
    if (progress_.joinable()) progress_.join();
    for (auto& u : user_ops_) u.req->complete(DOPT_ERR_ABORTED, aborted(u.req->op()));
    user_ops_.clear();
  }

  /// Post the user send/recv queued since the last call and complete the
  /// finished ones: DOPT_OK, COMM when failed_peer() names a dead rank,
  /// TIMEOUT after timeout_s (each also fails the communicator). Progress
  /// thread only; a transport that waits inside a collective calls it from
  /// its progress loop too, so user messages move mid-collective.
  /// Returns true when it posted or completed something.
  bool progress_user_ops() {
    std::deque<std::function<void()>> posts;
    {
      std::lock_guard<std::mutex> lk(qmu_);
      posts.swap(posts_);
    }
    for (auto& post : posts) post();
    bool moved = !posts.empty();
    if (user_ops_.empty()) return moved;
    const auto now = Clock::now();
    std::string dead;
    const bool peer_failed = failed_peer(&dead) >= 0;
    for (auto it = user_ops_.begin(); it != user_ops_.end();) {
      dopt_status st = DOPT_OK;
      std::string why;
      try {
        if (transport_->test(it->handle)) {
          it->req->complete(DOPT_OK);
          it = user_ops_.erase(it);
          moved = true;
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
      } catch (const Error& e) {
        st = e.status();
        why = e.what();
      }
      if (st == DOPT_ERR_COMM || st == DOPT_ERR_TIMEOUT) cancel(it->handle);
      fail(st, why);
      it->req->complete(st, it->req->op() + ": " + why);
      it = user_ops_.erase(it);
      moved = true;
    }
    return moved;
  }

  /// Now + timeout_s.
  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(cfg_.timeout_s));
  }
  /// "<op>: aborted (communicator destroyed)".
  static std::string aborted(const std::string& op) {
    return op + ": aborted (communicator destroyed)";
  }

  // Shared with the transport (valid for the communicator's lifetime).
  /// Set on destruction (and by a derived on_failure that aborts): a running
  /// operation should end; shm waits read it too.
  std::atomic<bool> aborting_{false};
  std::atomic<bool> destroying_now_{false};  ///< set on destruction only: end at once
  FaultPoint& fault() { return fault_; }     ///< test-only fault injection, progress thread
  const ShellConfig& shell_config() const { return cfg_; }
  /// The store key prefix of this communicator (the C ABI's dopt_create_args::scope;
  /// a PrefixStore's prefix in Gloo and PyTorch): unique per instance, identical on
  /// every rank.
  const std::string& prefix() const { return prefix_; }
  const std::string& scope() const { return prefix_; }  ///< 1.x alias of prefix()
  const std::string& job_token() const { return token_; }
  const std::string& bind_address() const { return bind_address_; }

  // Hooks. All have defaults; none may throw unless it says so.

  /// Create a communicator of the derived class for a split (collective on
  /// the members; `a` names rank, world, store, key prefix, token, address; no
  /// options: keep the parent's). Throws sdk::Error.
  virtual std::unique_ptr<Communicator> split_child(const dopt_create_args& a) = 0;
  /// Wake an operation blocked in the transport (e.g. write an eventfd);
  /// called on destruction after aborting_ is set. Any thread.
  virtual void wake_transport() {}
  /// The cause to record for a failure (e.g. append which peers went
  /// silent). Any thread.
  virtual std::string describe_failure(dopt_status, const std::string& cause, bool) {
    return cause;
  }
  /// After the first failure was recorded (e.g. abort the transport, tell
  /// the peers when `notify_peers`). Any thread.
  virtual void on_failure(dopt_status, const std::string&, bool /*notify_peers*/) {}
  /// The rank whose link failed (its cause in *why), else -1. Progress thread.
  virtual int failed_peer(std::string* /*why*/) { return -1; }
  /// A failed operation's outcome before it fails the communicator (e.g.
  /// learn from a side channel that the broken link's peer closed on
  /// purpose and say so). Progress thread.
  virtual void refine_failure(Result&) {}
  /// Adds the transport's failure signals to a shared-memory wait.
  virtual void add_wait_signals(shm::WaitCtx&) {}
  /// Bytes the transport moved since the last call. Progress thread.
  virtual void take_bytes(uint64_t* sent, uint64_t* received) {
    *sent = 0;
    *received = 0;
  }
  /// Drive the transport while no operation runs; true when it made
  /// progress. The default moves the user send/recv. Progress thread.
  virtual bool idle_progress() { return progress_user_ops(); }
  /// Give up an outstanding user send/recv whose peer failed or timed out
  /// (the default forgets it: the transport must then tolerate that).
  virtual void cancel(Handle) {}
  /// Whether post_user takes a recv after the communicator failed, and
  /// completes it from a message that arrived whole before the failure
  /// (else fails it). Default false: such a recv fails at once.
  virtual bool recv_after_failure() const { return false; }
  /// Start a user send/recv of `b` to/from `peer` with `tag`, completing
  /// `req`. The default queues it for the progress thread, which posts it
  /// on the transport tagged Tag::user(tag) (a tag < 0 is
  /// INVALID_ARGUMENT); a transport with its own channel for these
  /// overrides it. Caller's thread; the communicator has not failed (but
  /// see recv_after_failure).
  virtual void post_user(const std::shared_ptr<Completion>& req, bool is_send, int peer,
                         int32_t tag, const HostBuffer& b) {
    if (tag < 0)
      throw Error(DOPT_ERR_INVALID_ARGUMENT, req->op() + ": tag " + std::to_string(tag) + " < 0");
    {
      std::lock_guard<std::mutex> lk(qmu_);
      if (stopping_) {
        req->complete(DOPT_ERR_ABORTED, aborted(req->op()));
        return;
      }
      posts_.push_back([this, req, is_send, peer, tag, b] {
        const uint64_t t = Tag::user(static_cast<uint32_t>(tag));
        const Handle h = is_send ? transport_->isend(peer, t, b.data, b.bytes())
                                 : transport_->irecv(peer, t, b.data, b.bytes());
        user_ops_.push_back(UserOp{req, h, peer, deadline()});
      });
    }
    qcv_.notify_one();
  }

 private:
  struct Op {
    std::shared_ptr<Completion> req;
    std::function<Result(Clock::time_point deadline)> body;
  };
  /// A user send/recv posted on the transport, completed by progress_user_ops.
  struct UserOp {
    std::shared_ptr<Completion> req;
    Handle handle;
    int peer;
    Clock::time_point deadline;
  };

  HostBuffer check(const DLTensor& t, const char* op, const char* which, bool reduce_dtype,
                   DType* dt = nullptr) const {
    return host_buffer(t, setup_.component, op, which, reduce_dtype, dt);
  }
  void check_peer(int32_t peer, const char* op) const {
    if (peer < 0 || peer >= world_ || peer == rank_)
      throw Error(DOPT_ERR_INVALID_ARGUMENT, std::string(op) + ": peer " + std::to_string(peer) +
                                                 " is not another rank in [0, " +
                                                 std::to_string(world_) + ")");
  }

  /// `inline_bytes` > 0: a shared-memory allreduce of that many bytes that
  /// may run on the calling thread (ShellSetup::inline_shm_bytes).
  std::unique_ptr<Request> enqueue(const std::string& name,
                                   std::function<Result(Clock::time_point)> body,
                                   uint64_t inline_bytes = 0) {
    auto req = std::make_shared<Completion>(name);
    dopt_status st = DOPT_OK;
    std::string cause;
    if (failed(&st, &cause)) {
      req->complete(st, name + ": " + cause);
    } else if (inline_bytes > 0 && claim_idle(inline_bytes)) {
      // In order: nothing was queued or running, and operations issued
      // meanwhile wait in the queue until this one is done.
      Op op{req, std::move(body)};
      run_op(op);
      bool more;
      {
        std::lock_guard<std::mutex> lk(qmu_);
        op_active_ = false;
        more = !queue_.empty();
      }
      if (more) qcv_.notify_one();  // a needless wake-up takes a core from the peers
      return std::make_unique<CompletionRequest>(req);
    } else {
      std::lock_guard<std::mutex> lk(qmu_);
      if (stopping_)
        req->complete(DOPT_ERR_ABORTED, aborted(name));
      else {
        queue_.push_back(Op{req, std::move(body)});
        queued_.fetch_add(1, std::memory_order_release);
      }
    }
    qcv_.notify_one();
    // No default timeout: a wait with timeout_ms < 0 waits for the
    // operation, which itself fails after timeout_s.
    return std::make_unique<CompletionRequest>(req);
  }

  std::unique_ptr<Request> user(const char* name, bool is_send, const DLTensor& buf, int32_t peer,
                                int32_t tag) {
    check_peer(peer, name);
    const HostBuffer b = check(buf, name, "buf", false);
    auto req = std::make_shared<Completion>(name);
    dopt_status st = DOPT_OK;
    std::string cause;
    if (failed(&st, &cause) && (is_send || !recv_after_failure()))
      req->complete(st, std::string(name) + ": " + cause);
    else
      post_user(req, is_send, peer, tag, b);
    return std::make_unique<CompletionRequest>(req);
  }

  /// Takes the operation slot when nothing is queued or running, then
  /// waits up to kArriveMicros for every shared-memory peer to arrive at
  /// an allreduce of the same `bytes`; gives the slot back if one does not.
  bool claim_idle(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lk(qmu_);
      if (stopping_ || op_active_ || !queue_.empty()) return false;
      op_active_ = true;
    }
    shm_->announce(bytes);
    constexpr int64_t kArriveMicros = 50;
    const auto until = Clock::now() + std::chrono::microseconds(kArriveMicros);
    for (int i = 0;; ++i) {
      if (shm_->peers_arrived(bytes)) return true;
      if (i >= 64 && Clock::now() >= until) break;
      if (i < 64)
        shm::detail::cpu_relax();
      else
        std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lk(qmu_);
    op_active_ = false;
    return false;
  }

  void progress_loop() {
    auto last_op = Clock::now();
    while (true) {
      Op op;
      bool have = false;
      // Right after an operation, look for the next one for a moment before
      // sleeping, giving the core away between looks: collectives come in
      // runs, and a sleeping thread's wake-up (5-60 us on a VM) would cost
      // more than a small shared-memory collective itself.
      while (queued_.load(std::memory_order_acquire) == 0 && user_ops_.empty() &&
             Clock::now() - last_op < std::chrono::microseconds(200))
        std::this_thread::yield();
      {
        std::unique_lock<std::mutex> lk(qmu_);
        // A queued operation waits while the calling thread runs one inline.
        auto runnable = [&] { return !queue_.empty() && !op_active_; };
        if (!runnable() && !stopping_ && user_ops_.empty() && posts_.empty()) {
          if (setup_.poll_when_idle)
            qcv_.wait_for(lk, std::chrono::milliseconds(1));
          else
            qcv_.wait(lk, [&] { return stopping_ || runnable() || !posts_.empty(); });
        }
        if (stopping_) return;
        if (runnable()) {
          op = std::move(queue_.front());
          queue_.pop_front();
          queued_.fetch_sub(1, std::memory_order_relaxed);
          op_active_ = true;
          have = true;
        }
      }
      if (have) {
        run_op(op);
        last_op = Clock::now();
        std::lock_guard<std::mutex> lk(qmu_);
        op_active_ = false;
      } else if (!idle_progress() && !user_ops_.empty()) {
        std::this_thread::yield();
      }
    }
  }

  void run_op(Op& op) {
    const std::string& name = op.req->op();
    dopt_status st = DOPT_OK;
    std::string cause;
    if (failed(&st, &cause)) {
      op.req->complete(st, name + ": " + cause);
      return;
    }
    const auto t0 = Clock::now();
    fault_.begin_op();
    Result r;
    try {
      r = op.body(deadline());
    } catch (const std::exception& e) {
      r.status = DOPT_ERR_INTERNAL;
      r.why = e.what();
    }
    metric_add("comm.seconds", std::chrono::duration<double>(Clock::now() - t0).count());
    if (r.bytes_sent) metric_add("comm.bytes_sent", static_cast<double>(r.bytes_sent));
    if (r.bytes_received) metric_add("comm.bytes_received", static_cast<double>(r.bytes_received));
    if (r.status >= 0) {
      op.req->complete(DOPT_OK);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(fmu_);
      if (destroying_) {
        op.req->complete(DOPT_ERR_ABORTED, aborted(name));
        return;
      }
    }
    refine_failure(r);
    fail(r.status == DOPT_ERR_ABORTED ? DOPT_ERR_COMM : r.status, r.why, true);
    failed(&st, &cause);
    op.req->complete(st, name + ": " + cause);
  }

  /// Run `body` (p2p collectives over the transport) until `deadline`; its
  /// sdk::Error becomes the result (COMM: failed_peer() names the peer).
  Result over_transport(const std::function<void()>& body) {
    Result res;
    try {
      body();
    } catch (const Error& e) {
      res.status = e.status();
      res.why = e.what();
      std::string ignored;
      if (res.status == DOPT_ERR_COMM) res.peer = failed_peer(&ignored);
    }
    take_bytes(&res.bytes_sent, &res.bytes_received);
    return res;
  }

  shm::WaitCtx wait_ctx(Clock::time_point deadline) {
    shm::WaitCtx c;
    c.deadline = deadline;
    c.abort = &aborting_;
    c.fault = &fault_;
    add_wait_signals(c);
    return c;
  }

  ShellSetup setup_;
  int rank_, world_;
  ShellConfig cfg_;
  dopt_store* store_;
  std::string prefix_, token_, bind_address_;
  int split_seq_ = 0;
  FaultPoint fault_;  // progress thread only (after construction)

  Transport* transport_ = nullptr;           // owned by the derived class
  std::unique_ptr<Collectives> coll_;        // progress thread only
  std::unique_ptr<shm::Collectives> shm_;    // null: collectives over the transport
  std::list<UserOp> user_ops_;               // progress thread only
  std::deque<std::function<void()>> posts_;  // user send/recv to post (under qmu_)

  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<Op> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), for the progress thread's lock-free look
  bool op_active_ = false;         // an operation runs (progress thread or inline); under qmu_
  bool stopping_ = false;
  std::thread progress_;

  mutable std::mutex fmu_;
  std::atomic<bool> failed_{false};
  bool destroying_ = false;
  dopt_status fail_status_ = DOPT_OK;
  std::string fail_cause_;
};

// ---- operations: checks on the caller's thread, work on the progress thread

inline std::unique_ptr<Request> P2PCommunicator::allreduce(const DLTensor& send, DLTensor& recv,
                                                           dopt_reduce_op op) {
  require_reduce_op(op, "allreduce");
  DType dt;
  const HostBuffer s = check(send, "allreduce", "send", true, &dt);
  const HostBuffer r = check(recv, "allreduce", "recv", true);
  require_same_dtype(s, r, "allreduce");
  if (s.count != r.count)
    throw Error(DOPT_ERR_INVALID_ARGUMENT, "allreduce: send has " + std::to_string(s.count) +
                                               " elements but recv has " + std::to_string(r.count));
  return enqueue(
      "allreduce",
      [this, s, r, dt, op](Clock::time_point d) {
        if (s.count == 0) return Result{};
        if (world_ == 1) {
          divide(dt, r.data, s.data, s.count, 1);  // a copy
          return Result{};
        }
        if (shm_) return shm_->allreduce(s.data, r.data, s.count, dt, op, wait_ctx(d));
        return over_transport([&] { coll_->allreduce(s.data, r.data, s.count, dt, op, d); });
      },
      shm_ && world_ > 1 && s.count > 0 && s.bytes() <= setup_.inline_shm_bytes ? s.bytes() : 0);
}

inline std::unique_ptr<Request> P2PCommunicator::reduce_scatter(const DLTensor& send,
                                                                DLTensor& recv, dopt_reduce_op op) {
  require_reduce_op(op, "reduce_scatter");
  DType dt;
  const HostBuffer s = check(send, "reduce_scatter", "send", true, &dt);
  const HostBuffer r = check(recv, "reduce_scatter", "recv", true);
  require_same_dtype(s, r, "reduce_scatter");
  if (s.count != r.count * static_cast<size_t>(world_))
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                "reduce_scatter: send has " + std::to_string(s.count) +
                    " elements, expected world_size * recv = " + std::to_string(r.count * world_));
  return enqueue("reduce_scatter", [this, s, r, dt, op](Clock::time_point d) {
    if (r.count == 0) return Result{};
    if (world_ == 1) {
      divide(dt, r.data, s.data, r.count, 1);
      return Result{};
    }
    if (shm_) return shm_->reduce_scatter(s.data, r.data, r.count, dt, op, wait_ctx(d));
    return over_transport([&] { coll_->reduce_scatter(s.data, r.data, r.count, dt, op, d); });
  });
}

inline std::unique_ptr<Request> P2PCommunicator::allgather(const DLTensor& send, DLTensor& recv) {
  const HostBuffer s = check(send, "allgather", "send", false);
  const HostBuffer r = check(recv, "allgather", "recv", false);
  if (s.bytes() * static_cast<size_t>(world_) != r.bytes())
    throw Error(DOPT_ERR_INVALID_ARGUMENT,
                "allgather: recv has " + std::to_string(r.bytes()) +
                    " bytes, expected world_size * send = " + std::to_string(s.bytes() * world_));
  return enqueue("allgather", [this, s, r](Clock::time_point d) {
    if (s.bytes() == 0) return Result{};
    if (shm_) return shm_->allgather(s.data, r.data, s.bytes(), wait_ctx(d));
    return over_transport([&] { coll_->allgather(s.data, r.data, s.bytes(), d); });
  });
}

inline std::unique_ptr<Request> P2PCommunicator::broadcast(DLTensor& buf, int32_t root) {
  if (root < 0 || root >= world_)
    throw Error(DOPT_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) +
                                               " is not in [0, " + std::to_string(world_) + ")");
  const HostBuffer b = check(buf, "broadcast", "buf", false);
  return enqueue("broadcast", [this, b, root](Clock::time_point d) {
    if (b.bytes() == 0 || world_ == 1) return Result{};
    if (shm_) return shm_->broadcast(b.data, b.bytes(), root, wait_ctx(d));
    return over_transport([&] { coll_->broadcast(b.data, b.bytes(), root, d); });
  });
}

inline std::unique_ptr<Request> P2PCommunicator::barrier() {
  return enqueue("barrier", [this](Clock::time_point d) {
    if (world_ == 1) return Result{};
    return over_transport([&] { coll_->barrier(d); });
  });
}

inline std::unique_ptr<Request> P2PCommunicator::send(const DLTensor& buf, int32_t peer,
                                                      int32_t tag) {
  return user("send", true, buf, peer, tag);
}

inline std::unique_ptr<Request> P2PCommunicator::recv(DLTensor& buf, int32_t peer, int32_t tag) {
  return user("recv", false, buf, peer, tag);
}

inline std::unique_ptr<Communicator> P2PCommunicator::split(int32_t color, int32_t key) {
  const StoreSplit sp =
      split_through_store(store_, prefix_, split_seq_++, rank_, world_, color, key, cfg_.timeout_s);
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
  return split_child(a);
}

}  // namespace distopt::sdk::p2p
