// The "distopt" torch.distributed backend (process_group.hpp).
//
// Each operation is issued on the caller's thread, in call order (so every
// rank issues collectives in the same order, as c10d requires), as one or
// more communicator requests; an Op keeps their tensors alive and knows what
// to do once they complete (copy back into non-contiguous outputs, finish a
// reduction the communicator has no kernel for). The group's completion
// thread waits for the Ops and completes their Work; their Futures are marked
// on a pool of callback threads, so that async work, getFuture().then(...)
// and DDP's hooks progress without the caller, and a callback that issues
// another operation and waits for it (PyTorch's PowerSGD hook does) does
// not block the completions it waits for.
#include "process_group.hpp"

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/process.hpp"
#include "distopt/registry.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/store.hpp"

namespace distopt::python {
namespace {

using Clock = std::chrono::steady_clock;
using c10d::OpType;
using c10d::ReduceOp;

// Send/recv tags of the operations built on point-to-point (scatter,
// alltoall); user tags stay below them.
constexpr int kScatterTag = 0x7ffffff0;
constexpr int kAlltoallTag = 0x7ffffff1;

// distopt's Store over torch's (a PrefixStore per group), so a communicator
// plugin rendezvouses through whatever init_process_group was given.
class C10dStore final : public Store {
 public:
  C10dStore(c10::intrusive_ptr<c10d::Store> s, std::chrono::milliseconds timeout)
      : s_(std::move(s)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    call(key, [&] { s_->set(key, value); });
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::vector<uint8_t> v;
    call(key, [&] {
      s_->wait({key}, timeout);
      v = s_->get(key);
    });
    return v;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t v = 0;
    call(key, [&] { v = s_->add(key, delta); });
    return v;
  }
  bool check(const std::string& key) override {
    bool v = false;
    call(key, [&] { v = s_->check({key}); });
    return v;
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  template <class F>
  static void call(const std::string& key, F&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      throw RendezvousError("process group store, key '" + key +
                            "': " + e.what_without_backtrace());
    }
  }
  c10::intrusive_ptr<c10d::Store> s_;
  std::chrono::milliseconds timeout_;
};

// The registry of this process's plugins, loaded at the first group.
const PluginRegistry& registry(const std::vector<std::string>& paths) {
  static std::mutex mu;
  static std::unique_ptr<PluginRegistry> reg;
  std::lock_guard<std::mutex> lock(mu);
  if (!reg) {
    reg = std::make_unique<PluginRegistry>();
    reg->discover(PluginRegistry::search_path(paths));
  }
  return *reg;
}

bool has_option(const ComponentInfo& ci, const std::string& name) {
  for (const auto& o : ci.options)
    if (o.name == name) return true;
  return false;
}

// `text` (a YAML/JSON map, may be empty) validated against the plugin's
// schema, with `defaults` for keys the text does not set and the schema has.
Options validated_options(const ComponentInfo& ci, const std::string& text,
                          const std::map<std::string, std::string>& defaults,
                          const std::string& where) {
  YAML::Node node;
  try {
    node = text.empty() ? YAML::Node(YAML::NodeType::Map) : YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("distopt backend: " + where + " is not YAML: " + e.what());
  }
  if (node.IsNull()) node = YAML::Node(YAML::NodeType::Map);
  if (!node.IsMap()) throw ConfigError("distopt backend: " + where + " must be a map of options");
  for (const auto& [k, v] : defaults)
    if (!node[k] && has_option(ci, k)) node[k] = v;
  return Options::validate(node, ci.options, "<distopt backend>", where);
}

// The communicator's reduction for `op` on `dtype`, if it has a kernel.
std::optional<dopt_reduce_op> native_op(ReduceOp::RedOpType op, at::ScalarType dtype) {
  const bool floating =
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16;
  const bool integer = dtype == at::kInt || dtype == at::kLong;
  if (!floating && !integer) return std::nullopt;
  switch (op) {
    case ReduceOp::SUM:
      return DOPT_REDUCE_SUM;
    case ReduceOp::AVG:  // an integer average truncates here, as torch's division does
      return floating ? std::optional<dopt_reduce_op>(DOPT_REDUCE_AVG) : std::nullopt;
    case ReduceOp::MIN:
      return DOPT_REDUCE_MIN;
    case ReduceOp::MAX:
      return DOPT_REDUCE_MAX;
    default:
      return std::nullopt;
  }
}

// Reduce `g` ([world, ...], every rank's contribution) over dim 0 locally.
at::Tensor reduce_rows(const at::Tensor& gathered, ReduceOp::RedOpType op) {
  const auto dtype = gathered.scalar_type();
  // 16-bit floats in float32 (CPU kernels such as prod have none for Half).
  const at::Tensor g =
      dtype == at::kHalf || dtype == at::kBFloat16 ? gathered.to(at::kFloat) : gathered;
  at::Tensor r;
  switch (op) {
    case ReduceOp::SUM:
      r = dtype == at::kBool ? g.any(0) : g.sum(0);
      break;
    case ReduceOp::AVG:
      r = at::isFloatingType(dtype) || at::isComplexType(dtype) ? g.mean(0)
                                                                : g.sum(0).div(g.size(0), "trunc");
      break;
    case ReduceOp::PRODUCT:
      r = dtype == at::kBool ? g.all(0) : g.prod(0);
      break;
    case ReduceOp::MIN:
      r = g.amin(0);
      break;
    case ReduceOp::MAX:
      r = g.amax(0);
      break;
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR: {
      TORCH_CHECK(!at::isFloatingType(dtype) && !at::isComplexType(dtype),
                  "distopt backend: bitwise reduction of a ", dtype, " tensor");
      r = g[0].clone();
      for (int64_t i = 1; i < g.size(0); ++i) {
        if (op == ReduceOp::BAND) r.bitwise_and_(g[i]);
        if (op == ReduceOp::BOR) r.bitwise_or_(g[i]);
        if (op == ReduceOp::BXOR) r.bitwise_xor_(g[i]);
      }
      break;
    }
    default:
      TORCH_CHECK(false, "distopt backend: unsupported reduce op ", static_cast<int>(op));
  }
  return r.to(dtype);
}

// A contiguous tensor viewed as its bytes (1-D uint8), for the operations
// that only move data.
at::Tensor bytes_of(const at::Tensor& c) { return c.reshape({-1}).view(at::kByte); }

at::Tensor contiguous(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// What one operation has in flight, and what to do when it completes.
struct Op {
  std::string what;               // "allreduce of 4.2 MB float32" (for messages)
  std::deque<sdk::DLView> views;  // stable DLTensors for the requests
  std::vector<CommRequest> reqs;  // all must complete
  std::function<void()> finish;   // after the requests: copy-outs, local reductions
  bool collective = true;         // collectives complete in issue order, p2p do not
  Clock::time_point deadline;

  DLTensor& view(const at::Tensor& t) {
    views.emplace_back(t);
    return *views.back().get();
  }
};

// Whether the interpreter is finalizing: a thread that takes the GIL then
// is ended by Python (pthread_exit, which aborts a C++ thread), so tensors
// that may hold a Python object are leaked instead of freed.
bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// Releases the GIL for its scope when this thread holds it.
class ReleaseGil {
 public:
  ReleaseGil() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~ReleaseGil() {
    if (state_) PyEval_RestoreThread(state_);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

// Runs posted functions (Future completions, with their then-callbacks) on
// threads of its own, starting another whenever every thread is busy, so
// that a callback blocked on a later completion never holds that completion
// back.
class CallbackPool {
 public:
  CallbackPool() : s_(std::make_shared<State>()) {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().pools.push_back(s_);
  }
  ~CallbackPool() {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      s_->stop = true;
    }
    s_->cv.notify_all();
    for (auto& t : threads_) {
      if (t.get_id() == std::this_thread::get_id())
        t.detach();  // the last reference went in one of its callbacks: it ends by itself
      else
        t.join();
    }
  }
  void post(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->queue.push_back(std::move(f));
    if (s_->queue.size() > s_->idle)
      threads_.emplace_back([s = s_] { loop(*s); });
    else
      s_->cv.notify_one();
  }
  /// Wait, at most `limit`, until no pool of this process has a callback
  /// queued or running (distopt/__init__.py calls it at exit, the GIL
  /// released: Python ends threads that take the GIL once it finalizes,
  /// which aborts a callback freeing a tensor).
  static void drain(std::chrono::milliseconds limit) {
    const auto until = Clock::now() + limit;
    std::vector<std::shared_ptr<State>> pools;
    {
      std::lock_guard<std::mutex> lock(registry().mu);
      for (auto it = registry().pools.begin(); it != registry().pools.end();) {
        if (auto p = it->lock()) {
          pools.push_back(p);
          ++it;
        } else {
          it = registry().pools.erase(it);
        }
      }
    }
    for (auto& p : pools) {
      std::unique_lock<std::mutex> lock(p->mu);
      p->cv_idle.wait_until(lock, until, [&] { return p->queue.empty() && p->running == 0; });
    }
  }

 private:
  // Shared with the threads, so that one of them may destroy the pool.
  struct State {
    std::mutex mu;
    std::condition_variable cv, cv_idle;
    std::deque<std::function<void()>> queue;
    size_t idle = 0, running = 0;
    bool stop = false;
  };
  struct Registry {
    std::mutex mu;
    std::vector<std::weak_ptr<State>> pools;
  };
  static Registry& registry() {
    static Registry* r = new Registry;  // never destroyed: used until the process ends
    return *r;
  }
  static void loop(State& s) {
    std::unique_lock<std::mutex> lock(s.mu);
    for (;;) {
      ++s.idle;
      s.cv.wait(lock, [&] { return s.stop || !s.queue.empty(); });
      --s.idle;
      if (s.queue.empty()) return;  // stopping, nothing left
      auto f = std::move(s.queue.front());
      s.queue.pop_front();
      ++s.running;
      lock.unlock();
      if (python_finalizing()) {
        new std::function<void()>(std::move(f));  // nobody waits now; see python_finalizing
      } else {
        f();
        f = nullptr;  // its tensors may take the GIL to go: not under mu
      }
      lock.lock();
      if (--s.running == 0 && s.queue.empty()) s.cv_idle.notify_all();
    }
  }
  std::shared_ptr<State> s_;
  std::vector<std::thread> threads_;
};

// c10d's Work for an Op: completed by the completion thread, its Future on
// the callback pool.
class Work final : public c10d::Work {
 public:
  Work(int rank, OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)) {
    std::vector<c10::Device> devices;
    for (const auto& t : outputs_)
      if (t.defined() && !t.is_cpu() &&
          std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices);
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  /// On the callback pool: the Future (its then-callbacks run here), then
  /// the Work, so that a caller woken by wait() finds both done.
  void complete(std::exception_ptr error) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

struct Pending {
  std::shared_ptr<Op> op;
  c10::intrusive_ptr<Work> work;
};

class ProcessGroup final : public C10dBase {
 public:
  ProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout, BackendOptions opts)
      : C10dBase(rank, size),
        opts_(std::move(opts)),
        timeout_(timeout.count() > 0 ? timeout : std::chrono::minutes(30)),
        store_(std::make_shared<C10dStore>(store, timeout_)) {
    host_ = create(opts_.communicator, opts_.options, "cpu", -1, host_options_);
    completer_ = std::thread([this] { complete_loop(); });
  }

  ~ProcessGroup() override {
    // Destroyed from Python (the GIL held): the threads joined below may
    // need it to finish a callback or free a tensor.
    ReleaseGil nogil;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (completer_.joinable()) completer_.join();
    callbacks_.reset();  // runs the last completions
  }

  const std::string getBackendName() const override { return "distopt"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& o) override {
    check_root(o.rootRank, "broadcast");
    auto op = start("broadcast", tensors, o.timeout);
    for (auto& t : tensors) {
      at::Tensor c = contiguous(t);
      op->reqs.push_back(comm(c).broadcast(op->view(bytes_of(c)), static_cast<int>(o.rootRank)));
      copy_back(*op, t, c);
    }
    return submit(op, OpType::BROADCAST, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& o) override {
    auto op = start("allreduce", tensors, o.timeout);
    for (auto& t : tensors) add_allreduce(*op, t, o.reduceOp, t);
    return submit(op, OpType::ALLREDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& o) override {
    auto op = start("allreduce_coalesced", tensors, o.timeout);
    for (auto& t : tensors) add_allreduce(*op, t, o.reduceOp, t);
    return submit(op, OpType::ALLREDUCE_COALESCED, tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& o) override {
    check_root(o.rootRank, "reduce");
    auto op = start("reduce", tensors, o.timeout);
    for (auto& t : tensors) {
      // An allreduce into a copy; the root keeps the result.
      at::Tensor tmp = t.clone(at::MemoryFormat::Contiguous);
      add_allreduce(*op, tmp, o.reduceOp, tmp);
      if (getRank() == o.rootRank) chain(*op, [t, tmp]() mutable { t.copy_(tmp); });
    }
    return submit(op, OpType::REDUCE, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& o) override {
    TORCH_CHECK(outputs.size() == inputs.size(),
                "distopt backend: allgather needs one output list per input");
    auto op = start("allgather", inputs, o.timeout);
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_list(outputs[i], inputs[i], "allgather");
      at::Tensor g = gather_all(*op, inputs[i]);
      auto outs = outputs[i];
      chain(*op, [outs, g]() mutable {
        for (size_t r = 0; r < outs.size(); ++r) outs[r].copy_(g[static_cast<int64_t>(r)]);
      });
    }
    return submit(op, OpType::ALLGATHER, flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& o) override {
    TORCH_CHECK(
        output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
        "distopt backend: _allgather_base needs an output of world_size (", getSize(),
        ") x the input's ", input.numel(), " elements of its dtype, got ", output.numel(), " of ",
        output.scalar_type());
    std::vector<at::Tensor> in{input};
    auto op = start("allgather", in, o.timeout);
    at::Tensor c = contiguous(output);
    op->reqs.push_back(
        comm(c).allgather(op->view(bytes_of(contiguous(input))), op->view(bytes_of(c))));
    copy_back(*op, output, c);
    return submit(op, OpType::_ALLGATHER_BASE, {output});
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& o) override {
    // outputs[r][j]: input j of rank r.
    TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(),
                "distopt backend: allgather_coalesced needs world_size output lists");
    auto op = start("allgather_coalesced", inputs, o.timeout);
    std::vector<at::Tensor> gathered;
    for (auto& in : inputs) gathered.push_back(gather_all(*op, in));
    chain(*op, [outputs, gathered]() mutable {
      for (size_t r = 0; r < outputs.size(); ++r)
        for (size_t j = 0; j < outputs[r].size() && j < gathered.size(); ++j)
          outputs[r][j].copy_(gathered[j][static_cast<int64_t>(r)]);
    });
    return submit(op, OpType::ALLGATHER_COALESCED, flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& o) override {
    check_root(o.rootRank, "gather");
    TORCH_CHECK(inputs.size() == 1, "distopt backend: gather takes one input tensor");
    const bool root = getRank() == o.rootRank;
    if (root) {
      TORCH_CHECK(outputs.size() == 1, "distopt backend: gather's root needs one output list");
      check_list(outputs[0], inputs[0], "gather");
    }
    auto op = start("gather", inputs, o.timeout);
    at::Tensor g = gather_all(*op, inputs[0]);
    if (root) {
      auto outs = outputs[0];
      chain(*op, [outs, g]() mutable {
        for (size_t r = 0; r < outs.size(); ++r) outs[r].copy_(g[static_cast<int64_t>(r)]);
      });
    }
    return submit(op, OpType::GATHER, flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& o) override {
    check_root(o.rootRank, "scatter");
    TORCH_CHECK(outputs.size() == 1, "distopt backend: scatter takes one output tensor");
    const int root = static_cast<int>(o.rootRank);
    auto op = start("scatter", outputs, o.timeout);
    op->collective = false;  // point-to-point underneath
    at::Tensor out = outputs[0];
    if (getRank() == root) {
      TORCH_CHECK(inputs.size() == 1, "distopt backend: scatter's root needs one input list");
      check_list(inputs[0], out, "scatter");
      for (int r = 0; r < getSize(); ++r) {
        at::Tensor c = contiguous(inputs[0][r]);
        if (r == root)
          chain(*op, [out, c]() mutable { out.copy_(c); });
        else
          op->reqs.push_back(comm(c).send(op->view(bytes_of(c)), r, kScatterTag));
      }
    } else {
      at::Tensor c = contiguous(out);
      op->reqs.push_back(comm(c).recv(op->view(bytes_of(c)), root, kScatterTag));
      copy_back(*op, out, c);
    }
    return submit(op, OpType::SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& o) override {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
                "distopt backend: reduce_scatter takes one output and one input list");
    check_list(inputs[0], outputs[0], "reduce_scatter");
    std::vector<at::Tensor> flat_in;
    for (const auto& t : inputs[0]) flat_in.push_back(t.reshape({-1}));
    at::Tensor send = at::cat(flat_in);
    auto op = start("reduce_scatter", outputs, o.timeout);
    add_reduce_scatter(*op, send, o.reduceOp, outputs[0]);
    return submit(op, OpType::REDUCE_SCATTER, outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& o) override {
    TORCH_CHECK(
        input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
        "distopt backend: _reduce_scatter_base needs an input of world_size (", getSize(),
        ") x the output's ", output.numel(), " elements of its dtype, got ", input.numel(), " of ",
        input.scalar_type());
    std::vector<at::Tensor> outs{output};
    auto op = start("reduce_scatter", outs, o.timeout);
    add_reduce_scatter(*op, contiguous(input).reshape({-1}), o.reduceOp, output);
    return submit(op, OpType::_REDUCE_SCATTER_BASE, outs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& o) override {
    const int world = getSize();
    auto rows = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      if (splits.empty()) {
        TORCH_CHECK(t.dim() > 0 && t.size(0) % world == 0, "distopt backend: alltoall_base's ",
                    which, " dim 0 is not divisible by world_size ", world);
        return std::vector<int64_t>(world, t.dim() > 0 ? t.size(0) / world : 0);
      }
      TORCH_CHECK(static_cast<int>(splits.size()) == world, "distopt backend: alltoall_base's ",
                  which, " split sizes need world_size (", world, ") entries");
      return splits;
    };
    const auto out_rows = rows(output, out_splits, "output");
    const auto in_rows = rows(input, in_splits, "input");
    std::vector<at::Tensor> outs{output};
    auto op = start("alltoall_base", outs, o.timeout);
    op->collective = false;
    at::Tensor in = contiguous(input), out = contiguous(output);
    int64_t in_at = 0, out_at = 0;
    for (int r = 0; r < world; ++r) {
      at::Tensor src = in.narrow(0, in_at, in_rows[r]), dst = out.narrow(0, out_at, out_rows[r]);
      in_at += in_rows[r];
      out_at += out_rows[r];
      exchange(*op, src, dst, r, kAlltoallTag);
    }
    copy_back(*op, output, out);
    return submit(op, OpType::ALLTOALL_BASE, outs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& o) override {
    TORCH_CHECK(static_cast<int>(outputs.size()) == getSize() &&
                    static_cast<int>(inputs.size()) == getSize(),
                "distopt backend: alltoall needs world_size input and output tensors");
    auto op = start("alltoall", outputs, o.timeout);
    op->collective = false;
    for (int r = 0; r < getSize(); ++r) {
      at::Tensor dst = contiguous(outputs[r]);
      exchange(*op, contiguous(inputs[r]), dst, r, kAlltoallTag);
      copy_back(*op, outputs[r], dst);
    }
    return submit(op, OpType::ALLTOALL, outputs);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    check_p2p(tensors, dst, tag, "send");
    auto op = start("send", tensors, c10d::kUnsetTimeout);
    op->collective = false;
    at::Tensor c = contiguous(tensors[0]);
    op->reqs.push_back(comm(c).send(op->view(bytes_of(c)), dst, tag));
    return submit(op, OpType::SEND, tensors);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    check_p2p(tensors, src, tag, "recv");
    auto op = start("recv", tensors, c10d::kUnsetTimeout);
    op->collective = false;
    at::Tensor c = contiguous(tensors[0]);
    op->reqs.push_back(comm(c).recv(op->view(bytes_of(c)), src, tag));
    copy_back(*op, tensors[0], c);
    return submit(op, OpType::RECV, tensors);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    TORCH_CHECK(false,
                "distopt backend: recv from any source is not supported; name the source rank");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    std::vector<at::Tensor> none;
    auto op = start("barrier", none, o.timeout);
    op->reqs.push_back(host_->barrier());
    return submit(op, OpType::BARRIER, none);
  }

 private:
  // ---- communicators ----

  std::unique_ptr<Communicator> create(const std::string& name, const std::string& options_text,
                                       const char* scope, int device, distopt::Options& options) {
    const ComponentInfo& ci = registry(opts_.plugin_paths).get(DOPT_KIND_COMMUNICATOR, name);
    std::map<std::string, std::string> defaults{
        {"timeout_s", std::to_string(std::max<int64_t>(1, timeout_.count() / 1000))}};
    if (device >= 0) defaults["device"] = std::to_string(device);
    options = validated_options(ci, options_text, defaults,
                                std::string(device >= 0 ? "cuda_" : "") + "communicator options");
    ProcessInfo proc;
    try {
      proc = detect_process_info();
    } catch (const Error&) {
    }
    const std::string rendezvous =
        std::getenv("MASTER_ADDR") ? std::string("env://") : proc.rendezvous;
    bind_address_ = choose_bind_address(rendezvous);
    dopt_create_args args{};
    args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    args.rank = getRank();
    args.world_size = getSize();
    args.local_rank = proc.world_size == getSize() ? proc.local_rank : 0;
    args.local_world_size = proc.world_size == getSize() ? proc.local_world_size : 1;
    args.options = options.c_handle();
    args.store = reinterpret_cast<dopt_store*>(store_.get());
    args.scope = scope;
    args.job_token = "";
    args.bind_address = bind_address_.c_str();
    CollectiveCheck check{
        store_,
        std::chrono::milliseconds(static_cast<int64_t>(opts_.collective_check_s * 1000)),
        {}};
    return std::make_unique<Communicator>(ci, args, check);
  }

  // The communicator for `t`'s device: the host one, or the CUDA one (created
  // collectively at the group's first CUDA operation).
  Communicator& comm(const at::Tensor& t) {
    if (t.is_cpu()) return *host_;
    std::lock_guard<std::mutex> lock(device_mu_);
    if (!device_) {
      TORCH_CHECK(t.is_cuda(), "distopt backend: tensors on ", t.device(),
                  " are not supported (CPU through '", opts_.communicator, "', CUDA through '",
                  opts_.cuda_communicator, "')");
      device_ = create(opts_.cuda_communicator, opts_.cuda_options, "cuda", t.device().index(),
                       device_options_);
      device_index_ = t.device().index();
    }
    TORCH_CHECK(t.device().index() == device_index_, "distopt backend: this process group's '",
                opts_.cuda_communicator, "' runs on cuda:", device_index_, ", not on ", t.device());
    // The communicator orders after the legacy default stream (communicator.h,
    // "Device memory"); work on any other current stream is waited for here.
    const auto* impl = c10::impl::getDeviceGuardImpl(t.device().type());
    const c10::Stream s = impl->getStream(t.device());
    if (s.id() != 0) s.synchronize();
    return *device_;
  }

  // ---- building an Op ----

  std::shared_ptr<Op> start(const std::string& name, const std::vector<at::Tensor>& tensors,
                            std::chrono::milliseconds timeout) {
    auto op = std::make_shared<Op>();
    int64_t bytes = 0;
    std::string dtype;
    for (const auto& t : tensors)
      if (t.defined()) {
        bytes += t.numel() * static_cast<int64_t>(t.element_size());
        dtype = c10::toString(t.scalar_type());
      }
    op->what = name + (tensors.empty() ? "" : " of " + std::to_string(bytes) + " bytes " + dtype);
    op->deadline = Clock::now() + (timeout.count() > 0 ? timeout : timeout_);
    return op;
  }

  // After the requests, copy `c` (the contiguous stand-in) into `t`.
  static void copy_back(Op& op, const at::Tensor& t, const at::Tensor& c) {
    if (t.is_same(c)) return;
    chain(op, [t, c]() mutable { t.copy_(c); });
  }

  static void chain(Op& op, std::function<void()> f) {
    if (!op.finish) {
      op.finish = std::move(f);
      return;
    }
    op.finish = [a = std::move(op.finish), b = std::move(f)] {
      a();
      b();
    };
  }

  // Allreduce `in` with `rop` into `out` (may be the same tensor).
  void add_allreduce(Op& op, const at::Tensor& in, const ReduceOp& rop, at::Tensor out) {
    at::Tensor c = contiguous(in);
    ReduceOp::RedOpType kind = rop.op_;
    if (kind == ReduceOp::PREMUL_SUM) {
      c = c * premul_factor(rop);
      kind = ReduceOp::SUM;
    }
    if (auto native = native_op(kind, c.scalar_type())) {
      op.reqs.push_back(comm(c).allreduce(op.view(c), op.view(c), *native));
      copy_back(op, out, c);
      return;
    }
    at::Tensor g = gather_all(op, c);
    chain(op, [out, g, kind]() mutable { out.copy_(reduce_rows(g, kind).view(out.sizes())); });
  }

  // Reduce-scatter `send` (world * n elements, flat) into `out` (n elements).
  void add_reduce_scatter(Op& op, at::Tensor send, const ReduceOp& rop, at::Tensor out) {
    ReduceOp::RedOpType kind = rop.op_;
    if (kind == ReduceOp::PREMUL_SUM) {
      send = send * premul_factor(rop);
      kind = ReduceOp::SUM;
    }
    send = contiguous(send);
    if (auto native = native_op(kind, send.scalar_type())) {
      at::Tensor c = contiguous(out);
      op.reqs.push_back(comm(c).reduce_scatter(op.view(send), op.view(c), *native));
      copy_back(op, out, c);
      return;
    }
    at::Tensor g = gather_all(op, send);  // [world, world * n]
    const int64_t n = out.numel(), rank = getRank();
    chain(op, [out, g, kind, n, rank]() mutable {
      out.copy_(reduce_rows(g.narrow(1, rank * n, n), kind).view(out.sizes()));
    });
  }

  // Every rank's `in`, as a [world, *in.shape] tensor filled when `op` completes.
  at::Tensor gather_all(Op& op, const at::Tensor& in) {
    at::Tensor c = contiguous(in);
    std::vector<int64_t> shape{getSize()};
    shape.insert(shape.end(), c.sizes().begin(), c.sizes().end());
    at::Tensor g = at::empty(shape, c.options());
    op.reqs.push_back(comm(c).allgather(op.view(bytes_of(c)), op.view(bytes_of(g))));
    return g;
  }

  // Send `src` to and receive `dst` from peer `r` (a copy when r is this rank).
  void exchange(Op& op, const at::Tensor& src, const at::Tensor& dst, int r, int tag) {
    if (r == getRank()) {
      chain(op, [dst, src]() mutable { dst.copy_(src); });
      return;
    }
    if (src.numel() > 0) op.reqs.push_back(comm(src).send(op.view(bytes_of(src)), r, tag));
    if (dst.numel() > 0) op.reqs.push_back(comm(dst).recv(op.view(bytes_of(dst)), r, tag));
  }

  static double premul_factor(const ReduceOp& rop) {
    auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
    TORCH_CHECK(s, "distopt backend: PREMUL_SUM without its factor");
#if TORCH_VERSION_MAJOR >= 2
    if (s->tensor_factor.defined()) return s->tensor_factor.item<double>();
#else
    if (!s->tensor_factors.empty()) return s->tensor_factors[0].item<double>();
#endif
    return s->double_factor;
  }

  void check_root(int64_t root, const char* what) const {
    TORCH_CHECK(root >= 0 && root < getSize(), "distopt backend: ", what, " root ", root,
                " is not a rank of this group (size ", getSize(), ")");
  }

  void check_p2p(const std::vector<at::Tensor>& ts, int peer, int tag, const char* what) const {
    TORCH_CHECK(ts.size() == 1, "distopt backend: ", what, " takes one tensor");
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "distopt backend: ", what,
                " peer ", peer, " is not another rank of this group (size ", getSize(), ")");
    TORCH_CHECK(tag >= 0 && tag < kScatterTag, "distopt backend: ", what, " tag ", tag,
                " is outside [0, ", kScatterTag, ")");
  }

  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like,
                  const char* what) const {
    TORCH_CHECK(static_cast<int>(list.size()) == getSize(), "distopt backend: ", what,
                " needs world_size (", getSize(), ") tensors in its list, got ", list.size());
    for (const auto& t : list)
      TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(),
                  "distopt backend: ", what, " needs tensors of ", like.numel(), " ",
                  like.scalar_type(), " elements in its list, got ", t.numel(), " ",
                  t.scalar_type());
  }

  static std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> out;
    for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
    return out;
  }

  c10::intrusive_ptr<c10d::Work> submit(const std::shared_ptr<Op>& op, OpType type,
                                        std::vector<at::Tensor> outputs) {
    auto work = c10::make_intrusive<Work>(getRank(), type, std::move(outputs));
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({op, work});
    }
    cv_.notify_one();
    return work;
  }

  // ---- completion ----

  // Complete `p`: its error if any, else run its finish. Every reference
  // this thread holds to the operation's tensors goes before the Work is
  // handed to the callback pool, which completes it; the pool counts as busy
  // until the Work's last reference there is gone, so a caller that wakes
  // and exits finds it busy in CallbackPool::drain (nothing frees a tensor
  // after the interpreter began to finalize).
  void complete(Pending& p, std::exception_ptr error) {
    if (!error && p.op->finish) {
      try {
        p.op->finish();
      } catch (...) {
        error = std::current_exception();
      }
    }
    p.op.reset();
    callbacks_->post([w = std::move(p.work), error] { w->complete(error); });
  }

  // True when every request of `op` is done; throws like CommRequest::test.
  static bool done(Op& op) {
    for (auto& r : op.reqs)
      if (!r.test()) return false;
    return true;
  }

  std::exception_ptr timeout_error(const Op& op) const {
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(timeout_).count();
    return std::make_exception_ptr(
        CommError(DOPT_ERR_TIMEOUT, "distopt backend (" + opts_.communicator + ")", op.what,
                  "rank " + std::to_string(getRank()) + " of " + std::to_string(getSize()) +
                      ": not complete within the operation's timeout (process group timeout " +
                      std::to_string(s) + " s)"));
  }

  void complete_loop() {
    std::list<Pending> mine;
    int idle = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (mine.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        while (!queue_.empty()) {
          mine.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        if (stop_) break;
      }
      // One collective alone in flight (the common case: DDP's buckets, a
      // blocking call): block in the communicator's wait, no polling.
      if (mine.size() == 1 && mine.front().op->collective) {
        Pending& p = mine.front();
        std::exception_ptr error;
        try {
          for (auto& r : p.op->reqs) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p.op->deadline -
                                                                                    Clock::now());
            if (left.count() <= 0 && !r.test()) throw CommError(DOPT_ERR_TIMEOUT, "", "", "");
            r.wait(std::max<int64_t>(left.count(), 1));
          }
        } catch (const CommError& e) {
          error = e.status() == DOPT_ERR_TIMEOUT && Clock::now() >= p.op->deadline
                      ? timeout_error(*p.op)
                      : std::current_exception();
        } catch (...) {
          error = std::current_exception();
        }
        complete(p, error);
        mine.pop_front();
        continue;
      }
      bool progressed = false;
      for (auto it = mine.begin(); it != mine.end();) {
        std::exception_ptr error;
        bool finished = false;
        try {
          finished = done(*it->op);
        } catch (...) {
          error = std::current_exception();
          finished = true;
        }
        if (!finished && Clock::now() >= it->op->deadline) {
          error = timeout_error(*it->op);
          finished = true;
        }
        if (finished) {
          complete(*it, error);
          it = mine.erase(it);
          progressed = true;
        } else {
          ++it;
        }
      }
      idle = progressed ? 0 : idle + 1;
      if (idle > 64) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::microseconds(std::min(50 * idle, 1000)),
                     [&] { return stop_ || !queue_.empty(); });
      } else if (idle > 0) {
        std::this_thread::yield();
      }
    }
    // Destroyed with operations in flight: give them a little time, then
    // fail them, so that no Work is left unfinished.
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (!mine.empty()) {
      Pending& p = mine.front();
      std::exception_ptr error;
      try {
        while (!done(*p.op) && Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!done(*p.op))
          error = std::make_exception_ptr(Error("distopt backend: " + p.op->what +
                                                " was in flight when its process "
                                                "group was destroyed"));
      } catch (...) {
        error = std::current_exception();
      }
      complete(p, error);
      mine.pop_front();
    }
  }

  BackendOptions opts_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<C10dStore> store_;
  std::string bind_address_;
  distopt::Options host_options_, device_options_;
  std::unique_ptr<Communicator> host_;
  std::mutex device_mu_;
  std::unique_ptr<Communicator> device_;
  int device_index_ = -1;

  std::unique_ptr<CallbackPool> callbacks_ = std::make_unique<CallbackPool>();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;  // submitted, not yet taken by the completion thread
  bool stop_ = false;
  std::thread completer_;
};

}  // namespace

void drain_callbacks(std::chrono::milliseconds limit) { CallbackPool::drain(limit); }

c10::intrusive_ptr<C10dBase> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int world_size,
                                                std::chrono::milliseconds timeout,
                                                const BackendOptions& options) {
  return c10::make_intrusive<ProcessGroup>(store, rank, world_size, timeout, options);
}

}  // namespace distopt::python
