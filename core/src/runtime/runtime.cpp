// Runtime: one rank's rendezvous, plugins and communicator, and the
// distributed optimizers built on them.
#include "distopt/runtime.hpp"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "base/services.hpp"
#include "config/inner_component.hpp"
#include "distopt/blas.hpp"
#include "distopt/device_rule.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/elastic_membership.hpp"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/precision.hpp"
#include "distopt/registry.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sharded_unit.hpp"
#include "distopt/store.hpp"
#include "distopt/threads.hpp"
#include "distopt/watchdog.hpp"
#include "optim/autotune.hpp"
#include "optim/optimizer_builder.hpp"
#include "runtime/membership.hpp"
#include "runtime/runtime_impl.hpp"

namespace distopt {

namespace {

// Autotuning's last stage: the job with its reducer flipped between `mean`
// and `hierarchical` (both compute the exact mean; not with `inner:`, and
// only when both plugins are found). Empty when that does not apply or the
// flipped job is refused (logged).
std::optional<optim::ComponentChoice> flat_or_hierarchical(const JobConfig& cfg,
                                                           const PluginRegistry& registry,
                                                           const optim::Resolver& resolve) {
  const ComponentConfig& red = cfg.reducer;
  if (!cfg.autotune.hierarchical || red.inner) return std::nullopt;
  const char* other = red.name == "mean"           ? "hierarchical"
                      : red.name == "hierarchical" ? "mean"
                                                   : nullptr;
  if (!other || !registry.find(DOPT_KIND_REDUCER, other)) return std::nullopt;
  ComponentConfig flip;
  flip.name = other;
  flip.mark = red.mark;
  flip.options = YAML::Node(YAML::NodeType::Map);
  if (red.options.IsMap())  // the core's bucket options; not the other plugin's own
    for (const OptionSpec& spec : bucket_option_specs())
      if (red.options[spec.name]) flip.options[spec.name] = YAML::Clone(red.options[spec.name]);
  try {
    return resolve(cfg.algorithm, flip);
  } catch (const std::exception& e) {
    log(DOPT_LOG_DEBUG, "autotune", std::string("not trying ") + other + ": " + e.what());
    return std::nullopt;
  }
}

}  // namespace

Runtime Runtime::from_yaml(const std::string& path) { return from_config(load_job_config(path)); }

namespace {
// The rendezvous proper: every rank checks in through the store and waits,
// within world.timeout_s in all, for the others, so a rank that never
// started is named here rather than as a communicator's socket timeout.
// Returns the number of ranks that share this rank's cores (core_set_id(),
// exchanged in the same keys), itself included.
int wait_for_every_rank(Store& store, const ProcessInfo& proc, const std::string& url,
                        double timeout_s) {
  if (proc.world_size <= 1) return 1;
  auto key = [](int r) { return "rendezvous/joined/" + std::to_string(r); };
  const std::string cores = core_set_id();
  store.set(key(proc.rank), std::vector<uint8_t>(cores.begin(), cores.end()));
  int sharing = 1;
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  // Blocking waits, one key after another (O(world size) store requests per
  // rank, no polling); only a timeout asks which ranks are missing.
  try {
    for (int r = 0; r < proc.world_size; ++r) {
      if (r == proc.rank) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const auto v = store.get(key(r), std::max(left, std::chrono::milliseconds(1)));
      if (std::string(v.begin(), v.end()) == cores) ++sharing;
    }
    return sharing;
  } catch (const RendezvousError&) {
  }
  std::vector<int> missing;
  for (int r = 0; r < proc.world_size; ++r)
    if (r != proc.rank && !store.check(key(r))) missing.push_back(r);
  if (missing.empty()) return wait_for_every_rank(store, proc, url, timeout_s);  // just now
  std::string names;
  for (int r : missing) names += (names.empty() ? "" : ", ") + std::to_string(r);
  throw RendezvousError(
      "rendezvous " + url + ": rank " + std::to_string(proc.rank) + " of " +
      std::to_string(proc.world_size) + " waited world.timeout_s = " + std::to_string(timeout_s) +
      " s, and rank(s) " + names + " never joined (not started, or at another rendezvous address)");
}

// The ranks of a new membership (elastic) that share this rank's cores,
// itself included: each publishes core_set_id() under `prefix`. Collective.
int ranks_sharing_cores(Store& store, const std::string& prefix, int rank, int world,
                        double timeout_s) {
  if (world <= 1) return 1;
  const std::string cores = core_set_id();
  store.set(prefix + "/cores/" + std::to_string(rank),
            std::vector<uint8_t>(cores.begin(), cores.end()));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  int sharing = 1;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    const auto v = store.get(prefix + "/cores/" + std::to_string(r), timeout);
    if (std::string(v.begin(), v.end()) == cores) ++sharing;
  }
  return sharing;
}

// Intra-op threads by the ranks that share this rank's cores, whoever
// started them (two launchers on one host, a rank that joined): unless the
// user chose (train.threads, an OMP_NUM_THREADS of their own).
void size_threads_by_sharing(const JobConfig& cfg, int sharing, int rank) {
  if (requested_threads_per_rank(static_cast<int>(cfg.train.threads)) > 0) return;
  const int n = threads_for_ranks_sharing_cores(sharing);
  if (n == at::get_num_threads()) return;
  set_threads_per_rank(n);
  log(DOPT_LOG_DEBUG, "runtime",
      "rank " + std::to_string(rank) + ": " + std::to_string(sharing) +
          " rank(s) share this rank's " + std::to_string(available_cores()) +
          " core(s): " + std::to_string(n) + " intra-op thread(s) per rank");
}
}  // namespace

namespace {
// Create communicator `name` of the job over its store (`scope` keeps its
// keys apart from another communicator's) and check the rank it reports.
std::unique_ptr<Communicator> create_communicator(const Runtime::Impl& m, const std::string& name,
                                                  const Options& options, const char* scope,
                                                  const CollectiveCheck& check) {
  const ComponentInfo& ci = m.registry.get(DOPT_KIND_COMMUNICATOR, name);
  dopt_create_args args{};
  args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  args.rank = m.proc.rank;
  args.world_size = m.proc.world_size;
  args.local_rank = m.proc.local_rank;
  args.local_world_size = m.proc.local_world_size;
  args.options = options.c_handle();
  args.store = reinterpret_cast<dopt_store*>(m.store.get());
  args.scope = scope;
  args.job_token = m.proc.token.c_str();
  args.bind_address = m.bind_address.c_str();
  auto comm = std::make_unique<Communicator>(ci, args, check);
  if (comm->world_size() != m.proc.world_size || comm->rank() != m.proc.rank)
    throw ComponentError(DOPT_ERR_INTERNAL, ci.name, "create",
                         "communicator reports rank " + std::to_string(comm->rank()) + " of " +
                             std::to_string(comm->world_size()) + ", expected " +
                             std::to_string(m.proc.rank) + " of " +
                             std::to_string(m.proc.world_size));
  return comm;
}
}  // namespace

void Runtime::Impl::disconnect() {
  control.reset();
  comm.reset();
  keep_until_disconnect.clear();
}

void Runtime::Impl::reconnect(const ProcessInfo& p, const std::string& prefix) {
  disconnect();
  proc.rank = p.rank;
  proc.world_size = p.world_size;
  proc.local_rank = p.local_rank;
  proc.local_world_size = p.local_world_size;
  // In place: optimizers hold pointers to these Options.
  ValidatedJob v = validate_job(cfg, registry, proc.world_size);
  validated.communicator = v.communicator;
  validated.reducer = v.reducer;
  validated.algorithm = v.algorithm;
  validated.optimizer = v.optimizer;
  validated.control_options = v.control_options;
  for (size_t k = 0; k < validated.phases.size() && k < v.phases.size(); ++k) {
    validated.phases[k].reducer = v.phases[k].reducer;
    validated.phases[k].algorithm = v.phases[k].algorithm;
  }
  size_threads_by_sharing(
      cfg, ranks_sharing_cores(*store, prefix, proc.rank, proc.world_size, cfg.timeout_s),
      proc.rank);
  set_watchdog(cfg.watchdog_seconds(), proc.rank);  // the rank's new number
  // Under `distopt launch`: its "[rank N] " prefixes follow the new number.
  if (const char* l = std::getenv("DISTOPT_LAUNCHER_PREFIX"); l && std::string(l) == "1") {
    const std::string line = "\x1b]distopt-rank=" + std::to_string(proc.rank) + "\x07\n";
    std::fflush(stdout);
    for (int fd : {1, 2}) {
      const ssize_t ignored = ::write(fd, line.data(), line.size());
      (void)ignored;
    }
  }
  CollectiveCheck check{
      store, std::chrono::milliseconds(static_cast<int64_t>(cfg.collective_check_s * 1000)),
      std::chrono::milliseconds(cfg.elastic.enabled ? 0 : -1)};
  const std::string data_scope = prefix + "/comm", control_scope = prefix + "/control";
  comm = create_communicator(*this, cfg.communicator.name, validated.communicator,
                             data_scope.c_str(), check);
  if (!validated.control_name.empty())
    control = create_communicator(*this, validated.control_name, validated.control_options,
                                  control_scope.c_str(), check);
}

namespace {

// A restarted rank of an elastic job: its launcher restart count, else 0.
int restart_count() {
  const char* v = std::getenv("DISTOPT_RESTART_COUNT");
  return v && *v ? std::max(0, std::atoi(v)) : 0;
}

// The member id the elastic launcher gave this process (it records the
// process's death under it: elastic/dead/<member>), else -1.
int64_t launcher_member() {
  const char* v = std::getenv(membership::kEnvMember);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (*end || x < 0)
    throw ConfigError(std::string(membership::kEnvMember) + "='" + std::string(v) +
                      "' is not a member id (an integer >= 0)");
  return x;
}

// A restarted rank joins the running job: it asks through the store, the
// running ranks admit it at their next commit (runtime/membership.hpp),
// and it arrives at that membership's agreement holding no commit.
void join_running_job(Runtime::Impl& m) {
  Store& store = *m.store;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(m.cfg.timeout_s * 1000));
  const int64_t n = store.add(membership::kJoinCount, 1);
  const std::string key = membership::join_request_key(n);
  const std::string node = runtime::node_name();
  store.set(key, std::to_string(m.member) + " " + node);
  std::string admitted;
  try {
    const auto v = store.get(key + "/admitted", timeout);
    admitted.assign(v.begin(), v.end());
  } catch (const RendezvousError&) {
    throw RendezvousError(
        "elastic: rank " + std::to_string(m.proc.rank) + " (member " + std::to_string(m.member) +
        ") asked to join the running job, and no running rank admitted it "
        "within world.timeout_s = " +
        std::to_string(m.cfg.timeout_s) + " s (the job ended, or it is at elastic.max_ranks)");
  }
  runtime::Admission a = runtime::Admission::decode(admitted);
  runtime::Arrival me;
  me.member = m.member;
  me.rank = static_cast<int>(a.members.size()) + 1000000;  // after the running ranks
  me.node = node;
  runtime::AgreeOptions o = a.options(m.cfg);
  runtime::Decision d = runtime::agree(store, me, o);
  ProcessInfo p = m.proc;
  runtime::place(d, m.member, node, p);
  m.joined_by = d;
  m.generation = d.generation;
  m.members.clear();
  for (const auto& x : d.members) m.members.push_back(x.member);
  m.reconnect(p, membership::generation_prefix(m.generation));
}

}  // namespace

Runtime Runtime::from_env() {
  const char* path = std::getenv("DISTOPT_CONFIG");
  if (!path || !*path)
    throw ConfigError(
        "DISTOPT_CONFIG is not set: start the program with `distopt launch --config JOB.yaml`, "
        "export DISTOPT_CONFIG, or call Runtime::from_yaml(path)");
  return from_yaml(path);
}

Runtime Runtime::from_config(const JobConfig& cfg) {
  ProcessInfo proc = detect_process_info();
  if (proc.source == "default" && cfg.world_size > 1)
    log(DOPT_LOG_WARN, "runtime",
        "world.size is " + std::to_string(cfg.world_size) +
            " but no launcher environment (DISTOPT_RANK, RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK) "
            "is set: "
            "running as a single process (use `distopt launch` or `distopt train`)");
  return from_config(cfg, proc);
}

Runtime Runtime::from_config(const JobConfig& cfg, const ProcessInfo& proc) {
  if (proc.world_size < 1 || proc.rank < 0 || proc.rank >= proc.world_size)
    throw ConfigError("rank " + std::to_string(proc.rank) + " is not in [0, " +
                      std::to_string(proc.world_size) + ")");
  // A rank of `launch --elastic --join` is started alone and joins a larger job.
  const char* join_env = std::getenv(membership::kEnvJoin);
  const bool new_member = join_env && std::string(join_env) == "1";
  if (proc.source != "default" && proc.rank == 0 && cfg.world_size_set && !new_member &&
      cfg.world_size != proc.world_size)
    log(DOPT_LOG_WARN, "runtime",
        cfg.path + ": world.size is " + std::to_string(cfg.world_size) + ", but the launcher (" +
            proc.source + ") started " + std::to_string(proc.world_size) + " ranks: running with " +
            std::to_string(proc.world_size));
  auto impl = std::make_shared<Impl>();
  Impl& m = *impl;
  m.cfg = cfg;
  // `distopt launch --elastic --nnodes MIN:MAX`: the job may grow to MAX
  // nodes' ranks (the job file's elastic.max_ranks wins when set).
  if (const char* v = std::getenv(membership::kEnvMaxRanks);
      v && *v && cfg.elastic.enabled && cfg.elastic.max_ranks == 0) {
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end || x < 1 || x > (1 << 20))
      throw ConfigError(std::string(membership::kEnvMaxRanks) + "='" + std::string(v) +
                        "' is not a number of ranks in [1, 1048576]");
    m.cfg.elastic.max_ranks = x;
  }
  m.proc = proc;
  check_plugin_dirs(cfg);
  m.registry.discover(PluginRegistry::search_path(cfg.plugin_paths));
  m.validated = validate_job(cfg, m.registry, proc.world_size);  // components may refuse the job
  // Before the rendezvous: every rank fails at once, nobody waits for a peer.
  check_precision_supported(cfg);
  set_threads_per_rank(
      choose_threads_per_rank(static_cast<int>(cfg.train.threads), proc.local_world_size));
  if (std::string fix = openblas_coretype_fix(); !fix.empty() && proc.rank == 0)
    log(DOPT_LOG_WARN, "runtime",
        "OpenBLAS runs its generic " + openblas_core_name() +
            " kernels on this CPU; start the program with "
            "OPENBLAS_CORETYPE=" +
            fix + " (training is several times faster; `distopt` does this itself)");

  // The launcher's rendezvous wins over the file's. A single process needs no
  // fixed port: let the store pick one, so two local jobs cannot collide.
  m.rendezvous = !proc.rendezvous.empty() ? proc.rendezvous : cfg.rendezvous;
  if (proc.world_size == 1 && proc.rendezvous.empty() && m.rendezvous.rfind("file://", 0) != 0)
    m.rendezvous = "tcp://127.0.0.1:0";
  m.bind_address = choose_bind_address(m.rendezvous);

  StoreOptions so;
  so.url = m.rendezvous;
  so.rank = proc.rank;
  so.world_size = proc.world_size;
  so.token = proc.token;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000));
  m.store = make_store(so);
  const int64_t given_member = cfg.elastic.enabled ? launcher_member() : -1;
  m.member = given_member >= 0 ? given_member : membership::member_id(proc.rank, restart_count());
  m.initial_world_size = proc.world_size;
  for (int r = 0; r < proc.world_size; ++r) m.members.push_back(r);
  if (cfg.elastic.enabled && (restart_count() > 0 || new_member)) {
    m.joining = true;
    // A process of `launch --elastic --join`: its launcher's numbers are
    // only names; a unique id comes from the store (the launcher takes it
    // there itself and hands it over, to record the process's death).
    if (new_member && given_member < 0) m.member = membership::joining_member_id(*m.store);
    join_running_job(m);
    log(DOPT_LOG_INFO, "runtime",
        std::string(new_member ? "elastic: new rank " : "elastic: restarted rank ") +
            std::to_string(proc.rank) + " joined as rank " + std::to_string(m.proc.rank) + " of " +
            std::to_string(m.proc.world_size) + " (generation " + std::to_string(m.generation) +
            ")");
    return Runtime(std::move(impl));
  }
  size_threads_by_sharing(cfg, wait_for_every_rank(*m.store, proc, m.rendezvous, cfg.timeout_s),
                          proc.rank);
  set_watchdog(cfg.watchdog_seconds(), proc.rank);

  CollectiveCheck check{
      m.store, std::chrono::milliseconds(static_cast<int64_t>(cfg.collective_check_s * 1000)),
      std::chrono::milliseconds(cfg.elastic.enabled ? 0 : -1)};
  m.comm = create_communicator(m, cfg.communicator.name, m.validated.communicator, "comm/0", check);
  if (!m.validated.control_name.empty()) {
    m.control = create_communicator(m, m.validated.control_name, m.validated.control_options,
                                    "comm/control", check);
    log(DOPT_LOG_DEBUG, "runtime",
        "control communicator " + m.validated.control_name + " beside " + m.comm->name() +
            " (host-memory collectives)");
  }
  const ComponentInfo& ci = m.registry.get(DOPT_KIND_COMMUNICATOR, cfg.communicator.name);
  log(DOPT_LOG_DEBUG, "runtime",
      "rank " + std::to_string(proc.rank) + "/" + std::to_string(proc.world_size) +
          " connected via " + ci.name + " (rendezvous " + m.rendezvous + ", bind " +
          m.bind_address + ")");
  return Runtime(std::move(impl));
}

int Runtime::rank() const { return impl_->proc.rank; }
int Runtime::world_size() const { return impl_->proc.world_size; }
bool Runtime::joining() const { return impl_->joining; }
int Runtime::local_rank() const { return impl_->proc.local_rank; }
const JobConfig& Runtime::config() const { return impl_->cfg; }
PluginRegistry& Runtime::registry() const { return impl_->registry; }
Store& Runtime::store() const { return *impl_->store; }
Communicator& Runtime::communicator() const { return *impl_->comm; }
Communicator& Runtime::control_communicator() const { return impl_->control_comm(); }

void Runtime::broadcast(const std::vector<torch::Tensor>& tensors, int root) {
  if (root < 0 || root >= world_size())
    throw ConfigError("broadcast root " + std::to_string(root) + " is not a rank");
  if (world_size() == 1) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> work;   // contiguous stand-ins for non-contiguous tensors
  std::deque<sdk::DLView> views;  // stable addresses while requests are in flight
  std::vector<CommRequest> reqs;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    at::Tensor c = t.is_contiguous() ? t.detach() : t.detach().contiguous();
    work.push_back(c);
    views.emplace_back(c);
    reqs.push_back(impl_->comm_for(views.back().get()->device.device_type)
                       .broadcast(*views.back().get(), root));
  }
  for (auto& r : reqs) r.wait();
  size_t k = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (!t.is_contiguous()) t.detach().copy_(work[k]);
    ++k;
  }
}

void Runtime::allreduce(torch::Tensor& t, bool average) {
  if (!t.defined() || t.numel() == 0) return;
  at::NoGradGuard no_grad;
  at::Tensor c = t.is_contiguous() ? t.detach() : t.detach().contiguous();
  sdk::DLView v(c);
  impl_->comm_for(v.get()->device.device_type)
      .allreduce(*v.get(), *v.get(), average ? DOPT_REDUCE_AVG : DOPT_REDUCE_SUM)
      .wait();
  if (!t.is_contiguous()) t.detach().copy_(c);
}

void Runtime::barrier() { impl_->control_comm().barrier().wait(); }

DistributedOptimizer Runtime::make_optimizer(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
    const std::vector<ParamGroupSpec>& groups) {
  return build_optimizer(named_params, groups, {});
}

DistributedOptimizer Runtime::build_optimizer(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
    const std::vector<ParamGroupSpec>& groups, Units units) {
  Impl& m = *impl_;
  // Every rank starts from rank 0's parameters.
  std::vector<torch::Tensor> tensors;
  for (const auto& np : named_params) tensors.push_back(np.second);
  if (!m.joining) broadcast(tensors, 0);  // a joining rank gets the state from its peers

  optim::OptimizerBuild b;
  b.keepalive = impl_;
  b.params.assign(named_params.begin(), named_params.end());
  for (const ParamGroupSpec& g : groups) b.groups.push_back({g.names, g.lr, g.weight_decay});
  b.reducer = m.registry.get(DOPT_KIND_REDUCER, m.cfg.reducer.name);
  b.reducer.traits = config::effective_traits(b.reducer, m.validated.reducer);  // ABI 1.3 inner
  b.algorithm = m.registry.get(DOPT_KIND_ALGORITHM, m.cfg.algorithm.name);
  b.reducer_options = &m.validated.reducer;
  b.algorithm_options = &m.validated.algorithm;
  b.resolve = [raw = impl_.get()](const ComponentConfig& alg, const ComponentConfig& red) {
    auto v = std::make_shared<ValidatedJob>(
        validate_job(with_components(raw->cfg, alg, red), raw->registry, raw->proc.world_size));
    optim::ComponentChoice c;
    c.reducer = raw->registry.get(DOPT_KIND_REDUCER, red.name);
    c.algorithm = raw->registry.get(DOPT_KIND_ALGORITHM, alg.name);
    c.reducer_options = std::shared_ptr<const Options>(v, &v->reducer);
    c.algorithm_options = std::shared_ptr<const Options>(v, &v->algorithm);
    return c;
  };
  for (size_t k = 0; k < m.cfg.schedule.size(); ++k) {
    const SchedulePhase& ph = m.cfg.schedule[k];
    optim::Phase p;
    p.until_epoch = ph.until_epoch;
    p.until_step = ph.until_step;
    p.choice.reducer = m.registry.get(DOPT_KIND_REDUCER, ph.reducer.name);
    p.choice.algorithm = m.registry.get(DOPT_KIND_ALGORITHM, ph.algorithm.name);
    p.choice.reducer_options =
        std::shared_ptr<const Options>(impl_, &m.validated.phases[k].reducer);
    p.choice.algorithm_options =
        std::shared_ptr<const Options>(impl_, &m.validated.phases[k].algorithm);
    b.schedule.push_back(std::move(p));
  }
  if (!b.schedule.empty()) {
    optim::use_components(b, b.schedule[0].choice);
    b.phase = 0;
  }
  if (m.cfg.autotune.enabled) {
    optim::ComponentChoice base;
    base.reducer = b.reducer;
    base.algorithm = b.algorithm;
    base.reducer_options = std::make_shared<Options>(*b.reducer_options);
    base.algorithm_options = std::make_shared<Options>(*b.algorithm_options);
    b.tuner = std::make_shared<optim::Autotuner>(
        m.cfg.autotune, std::move(base), flat_or_hierarchical(m.cfg, m.registry, b.resolve));
  }
  b.optimizer_options = &m.validated.optimizer;
  b.optimizer_name = m.cfg.optimizer_name;
  if (m.cfg.lr_schedule) {
    try {
      m.cfg.lr_schedule->validate();  // total_steps: the embedding API has no epochs to count
    } catch (const ConfigError& e) {
      throw ConfigError(m.cfg.path + ": " + e.what());
    }
    b.lr_schedule = m.cfg.lr_schedule;
  }
  b.grad_clip = m.cfg.grad_clip;
  b.precision = m.cfg.precision;
  b.join = m.cfg.join;
  b.comm = m.comm->ref();
  b.comm_devices = m.comm->devices();
  b.control = m.control_comm().ref();
  b.common.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  b.common.rank = m.proc.rank;
  b.common.world_size = m.proc.world_size;
  b.common.local_rank = m.proc.local_rank;
  b.common.local_world_size = m.proc.local_world_size;
  b.common.store = reinterpret_cast<dopt_store*>(m.store.get());
  b.common.job_token = m.proc.token.c_str();
  b.common.bind_address = m.bind_address.c_str();
  b.scope = "optimizer/" + std::to_string(m.next_optimizer++);
  b.job_path = m.cfg.path;
  b.param_units = std::move(units.of_param);
  b.unit_slots = std::move(units.slots);
  b.unit_names = std::move(units.names);
  b.unit_notes = std::move(units.notes);
  return optim::build_optimizer(std::move(b));
}

Runtime::Units Runtime::find_units(
    torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  Units units;
  std::map<const c10::TensorImpl*, size_t> index;  // parameter -> position in `named`
  for (size_t i = 0; i < named.size(); ++i) index.emplace(named[i].second.unsafeGetTensorImpl(), i);
  units.of_param.assign(named.size(), -1);
  std::vector<std::string> paths;  // per unit: its module path ("" = root)
  std::vector<std::vector<std::string>> users(named.size());  // per parameter: modules holding it
  for (const auto& item : module.named_modules()) {
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      auto it = index.find(p.value().unsafeGetTensorImpl());
      if (it != index.end()) users[it->second].push_back(item.key());
    }
    auto unit = std::dynamic_pointer_cast<ShardedUnitImpl>(item.value());
    if (!unit) continue;
    units.slots.push_back(unit->slot());
    units.names.push_back(item.key().empty() ? "(the root module)" : item.key());
    paths.push_back(item.key());
  }
  auto encloses = [](const std::string& outer, const std::string& path) {
    return outer.empty() || path == outer || path.rfind(outer + ".", 0) == 0;
  };
  // A parameter belongs to the innermost unit that encloses every module
  // holding it (FSDP: a shared parameter goes to the lowest common ancestor),
  // or to none: then it stays whole on every rank.
  auto innermost = [&](const std::vector<std::string>& holders) {
    int best = -1;
    for (size_t u = 0; u < paths.size(); ++u) {
      bool all = !holders.empty();
      for (const auto& h : holders) all = all && encloses(paths[u], h);
      if (all && (best < 0 || paths[u].size() > paths[static_cast<size_t>(best)].size()))
        best = static_cast<int>(u);
    }
    return best;
  };
  for (size_t i = 0; i < named.size(); ++i) {
    const int best = innermost(users[i]);
    units.of_param[i] = best;
    std::set<int> own;  // the innermost unit of each module holding it
    for (const auto& h : users[i]) own.insert(innermost({h}));
    if (own.size() > 1)
      units.notes.push_back(
          "parameter '" + named[i].first + "' is shared by units that do not nest: " +
          (best < 0 ? std::string("it stays whole on every rank (no unit encloses them)")
                    : "it belongs to their enclosing unit '" +
                          units.names[static_cast<size_t>(best)] + "'"));
  }
  return units;
}

DistributedOptimizer Runtime::make_optimizer(torch::nn::Module& module,
                                             const std::vector<ParamGroupSpec>& groups) {
  std::vector<torch::Tensor> buffers = module.buffers();
  if (!impl_->joining) broadcast(buffers, 0);
  std::vector<std::pair<std::string, torch::Tensor>> named, named_buffers;
  // A parameter registered under several names (tied weights) is one
  // parameter, under its first name: libtorch's named_parameters() lists it
  // once per name, PyTorch's Python one once.
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters())
    if (seen.insert(item.value().unsafeGetTensorImpl()).second)
      named.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers())
    named_buffers.emplace_back(item.key(), item.value());
  DistributedOptimizer opt = build_optimizer(named, groups, find_units(module, named));
  opt.set_buffers(named_buffers, impl_->cfg.buffer_sync);
  return opt;
}

}  // namespace distopt
