// Elastic training (distopt/elastic.hpp): in-memory commits with buddy
// copies, and the recovery that rebuilds the job on the survivors.
#include "distopt/elastic.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <sstream>

#include "base/services.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/elastic_membership.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"
#include "optim/snapshot.hpp"
#include "runtime/elastic_link.hpp"
#include "runtime/membership.hpp"
#include "state/exchange.hpp"
#include "state/manifest.hpp"
#include "state/shard_state.hpp"
#include "state/state_source.hpp"

namespace distopt {

namespace {

using Clock = std::chrono::steady_clock;
using runtime::Arrival;
using runtime::CommitId;
using runtime::Decision;

// Tags of the buddy exchange on the control communicator (two: sizes, bytes).
constexpr int kCommitTag = 0x454c0000;
// Pieces of a recovery's exchange that are no rank's state: the commit's
// description and its replicated state (for ranks that hold no commit).
constexpr int64_t kDescriptionPiece = -1;
constexpr int64_t kReplicasPiece = -2;
using Part = state::ShardState::Part;
// Ranks that keep the replicated state in their commits (a rank and its
// buddy, as for any shard; the others copy none of it).
constexpr int kReplicaKeepers = 2;

struct Commit {
  CommitId id;
  int rank = 0, world_size = 1;
  int64_t step = 0;
  checkpoint::Manifest manifest;
  CheckpointExtra position;
  state::ShardState own;    // this rank's state, replicated state included
  std::vector<char> buddy;  // rank (rank - 1) mod world_size's, packed, without it
  // The buddy exchange while it is in flight (the newest commit only): the
  // commit counts as held once it has arrived.
  std::unique_ptr<state::ShiftInFlight> shift;
  bool complete() const { return !shift; }
};

// [int64 rank][int64 size][bytes]... : what a survivor contributes.
void put_piece(std::vector<char>& out, int64_t rank, const std::vector<char>& bytes) {
  const int64_t head[2] = {rank, static_cast<int64_t>(bytes.size())};
  const char* h = reinterpret_cast<const char*>(head);
  out.insert(out.end(), h, h + sizeof head);
  out.insert(out.end(), bytes.begin(), bytes.end());
}

std::vector<std::pair<int64_t, std::vector<char>>> pieces_of(const std::vector<char>& in) {
  std::vector<std::pair<int64_t, std::vector<char>>> out;
  size_t at = 0;
  while (at + 2 * sizeof(int64_t) <= in.size()) {
    int64_t head[2];
    std::memcpy(head, in.data() + at, sizeof head);
    at += sizeof head;
    if (head[1] < 0 || at + static_cast<size_t>(head[1]) > in.size())
      throw ElasticError("elastic: a survivor's state package is truncated");
    out.emplace_back(head[0],
                     std::vector<char>(in.begin() + static_cast<std::ptrdiff_t>(at),
                                       in.begin() + static_cast<std::ptrdiff_t>(at) + head[1]));
    at += static_cast<size_t>(head[1]);
  }
  return out;
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// Test-only: DISTOPT_FAULT_INJECT=...,elastic_exit:MEMBER:PHASE makes the
// process that started as rank MEMBER _exit(137) in its first recovery,
// PHASE "arrive" (before the agreement) or "connect" (after it, before the
// communicators are created: the others fail in theirs and try again).
void maybe_die_in_recovery(int64_t member, const char* phase) {
  const char* v = std::getenv("DISTOPT_FAULT_INJECT");
  if (!v) return;
  const std::string all = v;
  const std::string want = "elastic_exit:" + std::to_string(member) + ":" + phase;
  for (size_t at = all.find(want); at != std::string::npos; at = all.find(want, at + 1)) {
    const size_t end = at + want.size();
    if ((at == 0 || all[at - 1] == ',') && (end == all.size() || all[end] == ',')) {
      std::fprintf(stderr, "DISTOPT_FAULT_INJECT: rank %lld exits (137) in the recovery (%s)\n",
                   static_cast<long long>(member), phase);
      std::fflush(stderr);
      _exit(137);
    }
  }
}

}  // namespace

bool is_peer_failure(const std::exception& e) {
  if (dynamic_cast<const CommError*>(&e) || dynamic_cast<const RendezvousError*>(&e)) return true;
  if (const auto* c = dynamic_cast<const ComponentError*>(&e)) {
    const dopt_status s = c->status();
    return s == DOPT_ERR_COMM || s == DOPT_ERR_TIMEOUT || s == DOPT_ERR_ABORTED;
  }
  return false;
}

struct Elastic::State {
  runtime::ElasticLink link_;
  torch::nn::Module& model;
  DistributedOptimizer& opt;
  JobConfig::Elastic cfg;
  double timeout_s = 60;
  int64_t member = 0;
  std::string node;
  int64_t generation = 0;
  int64_t seq = 0;               // commits made in this generation
  std::vector<int64_t> members;  // member ids in rank order
  std::deque<Commit> commits;    // newest last, at most two
  int64_t steps_at_commit = -1;
  int64_t last_recovery_step = -1;  // a failure that recurs without progress is no dead rank
  int recoveries_in_place = 0;

  State(Runtime& r, torch::nn::Module& m, DistributedOptimizer& o)
      : link_(r), model(m), opt(o), cfg(r.config().elastic), timeout_s(r.config().timeout_s) {}

  runtime::ElasticLink& link() { return link_; }

  // The newest commit's buddy copy: wait for it (it left with the commit
  // and has usually arrived by now). Throws CommError for a dead peer.
  // A commit whose exchange failed is forgotten (its requests have completed).
  void settle() {
    if (commits.empty() || commits.back().complete()) return;
    Commit& c = commits.back();
    try {
      c.buddy = c.shift->finish();
    } catch (...) {
      commits.pop_back();
      throw;
    }
    c.shift.reset();
  }
  // Before the communicators go (a recovery): settle, or roll back further
  // when the newest commit's exchange cannot complete (a peer died in it).
  void settle_or_drop() {
    try {
      settle();
    } catch (const std::exception& e) {
      log(DOPT_LOG_DEBUG, "elastic",
          std::string("recovery: the newest commit's buddy copy did not arrive (") + e.what() +
              "); rolling back further");
    }
  }
  // Leaving (the job ends or unwinds): no waiting for the neighbours, which
  // may be elsewhere; the buffers stay until the communicators are gone.
  ~State() {
    for (Commit& c : commits)
      if (c.shift) link().keep_until_disconnect(c.shift->abandon());
  }

  void commit(const CheckpointExtra& position) {
    runtime::ElasticLink& m = link();
    // The previous commit's bytes arrive while this one's snapshot is taken.
    if (!commits.empty() && commits.back().shift) commits.back().shift->progress();
    Commit c;
    c.id = CommitId{generation, seq++};
    c.rank = m.process().rank;
    c.world_size = m.process().world_size;
    c.step = opt.steps();
    c.position = position;
    // Replicated state (the model, plain allreduce's optimizer state) stays
    // here on ranks 0 and 1; what this rank alone holds goes to its buddy,
    // in the background: no rank waits for another at a commit.
    c.own = optim::snapshot(model, opt, c.rank, c.rank < kReplicaKeepers);
    c.manifest = optim::describe(opt, c.world_size);
    settle();
    c.shift = std::make_unique<state::ShiftInFlight>(c.own.pack(c.rank, c.world_size, Part::own),
                                                     m.control_communicator().ref(), c.rank,
                                                     c.world_size, kCommitTag);
    commits.push_back(std::move(c));
    while (commits.size() > 3) commits.pop_front();  // two held, and one in flight
    steps_at_commit = opt.steps();
  }

  // Drop the optimizer's components, then the communicators they used.
  void tear_down(optim::OptimizerBuild* build, uint64_t* bytes) {
    if (optim::attached(opt)) *build = optim::detach(opt, bytes);
    link().disconnect();
  }

  const Commit* held(const CommitId& id) const {
    for (const Commit& c : commits)
      if (c.id == id) return &c;
    return nullptr;
  }

  // The commit's description for ranks that hold none (joining ranks):
  // its world size, manifest and data position, sent by the new rank 0.
  static std::vector<char> describe_commit(const Commit& c) {
    std::string text = std::to_string(c.world_size) + " " + std::to_string(c.step) + "\n";
    text += std::to_string(c.position.size()) + "\n";
    for (const auto& [k, v] : c.position) text += k + "\n" + v + "\n";
    // The manifest's shard records are a checkpoint's files; placeholders
    // here, so that it parses.
    checkpoint::Manifest man = c.manifest;
    man.shards.assign(static_cast<size_t>(man.world_size), checkpoint::ShardRecord{});
    for (int r = 0; r < man.world_size; ++r)
      man.shards[static_cast<size_t>(r)] = {r, checkpoint::shard_file_name(r, man.world_size), 0,
                                            0};
    text += man.to_json();
    return std::vector<char>(text.begin(), text.end());
  }
  struct Described {
    int world_size = 0;
    int64_t step = 0;
    CheckpointExtra position;
    checkpoint::Manifest manifest;
  };
  static Described read_description(const std::vector<char>& bytes) {
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    Described d;
    size_t n = 0;
    std::string line;
    in >> d.world_size >> d.step >> n;
    std::getline(in, line);
    for (size_t i = 0; i < n; ++i) {
      std::string k, v;
      std::getline(in, k);
      std::getline(in, v);
      d.position[k] = v;
    }
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    d.manifest = checkpoint::Manifest::from_json(json, "the in-memory commit's description");
    return d;
  }

  // Every member's pieces of the target commit to every member (`c` is
  // this rank's copy, null in a joining rank), then the commit's world's
  // shards, each from its owner or else its buddy. Also returns the
  // commit's description (from the new rank 0, which holds it).
  std::vector<state::ShardState> gather_shards(const Decision& d, const Commit* c, int rank,
                                               int world, Described* desc) {
    std::set<int> owners;
    int saved_world = 0;
    for (const Arrival& a : d.members)
      for (const Arrival::Held& h : a.held)
        if (h.id == d.target) {
          owners.insert(h.rank);
          saved_world = h.world_size;
        }
    // Replicated state: ranks 0 and 1 of the commit's world kept it; the
    // first of them that survives sends it to everyone.
    int keeper = -1;
    for (int r : owners)
      if (r < kReplicaKeepers && (keeper < 0 || r < keeper)) keeper = r;
    if (keeper < 0)
      throw ElasticError(
          "elastic: the replicated state (the model, plain allreduce's optimizer "
          "state) of the in-memory commit was kept by ranks 0 and 1 of " +
          std::to_string(saved_world) +
          ", both lost; restore from the disk checkpoint (distopt train --resume)");
    std::vector<char> mine;
    if (c) {
      if (rank == 0) put_piece(mine, kDescriptionPiece, describe_commit(*c));
      if (c->rank == keeper)
        put_piece(mine, kReplicasPiece, c->own.pack(0, c->world_size, Part::replicas));
      put_piece(mine, c->rank, c->own.pack(c->rank, c->world_size, Part::own));
      const int lent = (c->rank + c->world_size - 1) % c->world_size;
      if (c->world_size > 1 && !owners.count(lent)) put_piece(mine, lent, c->buddy);
    }
    auto all =
        state::allgather_bytes(std::move(mine), link().control_communicator().ref(), rank, world);
    std::vector<std::optional<state::ShardState>> shards(static_cast<size_t>(saved_world));
    std::optional<state::ShardState> replicas;
    for (const auto& bytes : all)
      for (auto& [r, blob] : pieces_of(bytes)) {
        if (r == kDescriptionPiece && !c) *desc = read_description(blob);
        if (r == kReplicasPiece && !(c && c->rank == keeper))
          replicas = state::ShardState::unpack(blob, "the in-memory commit's replicated state", 0,
                                               saved_world);
        if (r < 0 || r >= saved_world || shards[static_cast<size_t>(r)]) continue;
        shards[static_cast<size_t>(r)] =
            state::ShardState::unpack(blob, "the in-memory commit of rank " + std::to_string(r),
                                      static_cast<int>(r), saved_world);
      }
    const bool keeps = c && c->rank == keeper;
    if (!keeps && !replicas)
      throw ElasticError("elastic: the commit's replicated state did not arrive");
    std::vector<int> lost;
    for (int r = 0; r < saved_world; ++r)
      if (!shards[static_cast<size_t>(r)]) lost.push_back(r);
    if (!lost.empty())
      throw ElasticError("elastic: the in-memory state of rank(s) " + list(lost) + " of " +
                         std::to_string(saved_world) +
                         " was lost together with its buddy copy (held by rank (r + 1) mod " +
                         std::to_string(saved_world) +
                         "); restore from the disk checkpoint (distopt train --resume)");
    // Rank 0's piece holds the replicated state, as in a checkpoint.
    shards[0]->add_replicas_of(keeps ? c->own : *replicas);
    std::vector<state::ShardState> out;
    for (auto& s : shards) out.push_back(std::move(*s));
    return out;
  }

  // Load the target commit into the rebuilt optimizer (every member).
  Described restore(const Decision& d, int rank, int world) {
    const Commit* c = held(d.target);
    Described desc;
    std::vector<state::ShardState> shards = gather_shards(d, c, rank, world, &desc);
    if (c) {  // the own copy is the truth; rank 0's description is for joiners
      desc.world_size = c->world_size;
      desc.step = c->step;
      desc.position = c->position;
      desc.manifest = c->manifest;
    }
    state::StateSource src(std::move(shards), rank, world);
    optim::OptimizerCheckpoint part(model, opt);
    const std::string where = "the in-memory commit of step " + std::to_string(desc.step);
    part.resume(desc.manifest, where);
    part.check_compatible(src, desc.manifest, where);
    part.restore(src, desc.manifest);
    return desc;
  }

  // This rank's arrival: its id, rank, node and the commits it holds.
  Arrival arrival() {
    Arrival me;
    me.member = member;
    me.rank = link().process().rank;
    me.node = node;
    for (const Commit& c : commits)
      if (c.complete()) me.held.push_back({c.id, c.rank, c.world_size});
    return me;
  }

  // One membership change: agree (options `o`), reconnect, rebuild,
  // restore. Returns the decision and the commit restored.
  Decision attempt(optim::OptimizerBuild& build, uint64_t bytes, const runtime::AgreeOptions& o,
                   Described* restored) {
    runtime::ElasticLink& m = link();
    maybe_die_in_recovery(member, "arrive");
    Arrival me = arrival();
    log(DOPT_LOG_DEBUG, "elastic",
        "recovery: rank " + std::to_string(me.rank) + " arrives at generation " +
            std::to_string(generation) + "'s agreement");
    Decision d = runtime::agree(m.store(), me, o);
    log(DOPT_LOG_DEBUG, "elastic",
        "recovery: generation " + std::to_string(d.generation) + " has " +
            std::to_string(d.members.size()) + " rank(s)");

    // From here on this rank belongs to generation d.generation, whatever fails.
    generation = d.generation;
    seq = 0;
    members.clear();
    for (const Arrival& a : d.members) members.push_back(a.member);
    m.enter(generation, members);
    ProcessInfo p = m.process();
    runtime::place(d, member, node, p);
    if (p.world_size < cfg.min_ranks)
      throw ElasticError(
          "elastic: " + std::to_string(p.world_size) +
          " rank(s) survive, fewer than elastic.min_ranks = " + std::to_string(cfg.min_ranks) +
          "; the job ends (restore from the disk checkpoint)");
    if (!held(d.target))
      throw ElasticError("elastic: the agreed commit is not held here");  // cannot happen

    maybe_die_in_recovery(member, "connect");
    m.reconnect(p, generation);
    build.comm = m.communicator().ref();
    build.comm_devices = m.communicator().devices();
    build.control = m.control_communicator().ref();
    build.common.rank = p.rank;
    build.common.world_size = p.world_size;
    build.common.local_rank = p.local_rank;
    build.common.local_world_size = p.local_world_size;
    // Store keys of the components: unique to this membership, whatever
    // each rank rebuilt before.
    build.scope = scope_root(build.scope) + "/elastic-g" + std::to_string(generation);
    build.rebuilds = 0;
    optim::reattach(opt, build, bytes);
    log(DOPT_LOG_DEBUG, "elastic", "recovery: communicators and optimizer rebuilt");
    *restored = restore(d, p.rank, p.world_size);
    return d;
  }

  static std::string scope_root(const std::string& scope) {
    return scope.substr(0, std::min(scope.find("/elastic-g"), scope.find("/build-")));
  }

  // Scale up at a commit: rank 0 looks for ranks asking to join (store key
  // elastic/join/count, taken in order: elastic/join/admitted) and all
  // agree on how many to take, up to max_ranks; then every rank, the
  // joining ones included, goes through a membership change that restores
  // the commit just made. Collective.
  void maybe_grow() {
    runtime::ElasticLink& m = link();
    const int world = m.process().world_size, rank = m.process().rank;
    if (world >= max_ranks) return;
    int64_t take = 0, before = 0;
    if (rank == 0) {
      before = m.store().add(membership::kJoinAdmitted, 0);
      const int64_t waiting = m.store().add(membership::kJoinCount, 0) - before;
      take = std::max<int64_t>(0, std::min<int64_t>(waiting, max_ranks - world));
      if (take > 0) m.store().add(membership::kJoinAdmitted, take);
    }
    const auto all = state::gather_i64(m.control_communicator().ref(), rank, world, {take, before});
    take = all[0];
    before = all[1];
    if (take <= 0) return;
    settle();  // the commit restored below must be held
    runtime::Admission a;
    a.generation = generation;
    a.members = members;
    std::vector<std::string> keys;
    for (int64_t n = before + 1; n <= before + take; ++n) {
      const std::string key = membership::join_request_key(n);
      const auto v =
          m.store().get(key, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
      a.members.push_back(std::stoll(std::string(v.begin(), v.end())));
      keys.push_back(key);
    }
    if (rank == 0)
      for (const std::string& k : keys) m.store().set(k + "/admitted", a.encode());
    log(DOPT_LOG_INFO, "elastic",
        "generation " + std::to_string(generation) + ": taking in " + std::to_string(take) +
            " rank(s) at optimizer step " + std::to_string(opt.steps()));
    const CheckpointExtra position = commits.back().position;
    optim::OptimizerBuild build;
    uint64_t bytes = 0;
    tear_down(&build, &bytes);
    Described restored;
    attempt(build, bytes, a.options(m.config()), &restored);
    steps_at_commit = -1;
    commit(position);
  }

  // A joining rank (Runtime::joining()): its communicators exist (the
  // runtime was taken in); take the commit from the peers, then commit
  // with them.
  void join() {
    runtime::ElasticLink& m = link();
    const runtime::Decision& d = m.joined_by();
    Described desc = restore(d, m.process().rank, m.process().world_size);
    steps_at_commit = -1;
    commit(desc.position);
    m.joined();
    rejoined = true;
  }

  int64_t max_ranks = 0;
  bool rejoined = false;
};

Elastic::Elastic(Runtime& rt, torch::nn::Module& model, DistributedOptimizer& opt)
    : s_(std::make_unique<State>(rt, model, opt)) {
  if (!rt.config().elastic.enabled)
    throw ConfigError(rt.config().path +
                      ": elastic.enabled is false; distopt::Elastic needs `elastic: {enabled: "
                      "true}` on every rank");
  runtime::ElasticLink& m = s_->link();
  s_->member = m.member();
  s_->node = runtime::node_name();
  s_->generation = m.generation();
  s_->members = m.members();
  s_->max_ranks = s_->cfg.max_ranks > 0 ? s_->cfg.max_ranks : m.initial_world_size();
  if (m.joining()) s_->join();
}

bool Elastic::rejoined() const { return s_->rejoined; }

CheckpointExtra Elastic::position() const {
  return s_->commits.empty() ? CheckpointExtra{} : s_->commits.back().position;
}

Elastic::~Elastic() = default;

void Elastic::commit(const CheckpointExtra& position) { s_->commit(position); }

bool Elastic::maybe_commit(const CheckpointExtra& position) {
  const int64_t steps = s_->opt.steps();
  if (s_->steps_at_commit >= 0 && steps - s_->steps_at_commit < s_->cfg.commit_every) return false;
  if (steps == s_->steps_at_commit) return false;
  s_->commit(position);
  s_->maybe_grow();
  return true;
}

Elastic::Recovery Elastic::recover() {
  State& s = *s_;
  const auto t0 = Clock::now();
  Recovery out;
  out.old_world_size = s.link().process().world_size;
  out.old_rank = s.link().process().rank;
  const std::vector<int64_t> old_members = s.members;
  s.settle_or_drop();
  if (s.commits.empty())
    throw ElasticError(
        "elastic: rank " + std::to_string(out.old_rank) +
        " has no in-memory commit to roll back to (a peer failed before the first commit)");
  const int64_t at = s.commits.back().step;
  s.recoveries_in_place = at == s.last_recovery_step ? s.recoveries_in_place + 1 : 0;
  s.last_recovery_step = at;
  if (s.recoveries_in_place >= 3)
    throw ElasticError("elastic: rank " + std::to_string(out.old_rank) +
                       " recovered to optimizer step " + std::to_string(at) +
                       " four times without getting past it: the failure recurs on the "
                       "survivors (not a dead rank; see the error before this one)");
  optim::OptimizerBuild build;
  uint64_t bytes = 0;
  log(DOPT_LOG_DEBUG, "elastic", "recovery: dropping the optimizer and the communicators");
  s.tear_down(&build, &bytes);
  // A rank dying during a recovery fails this attempt on the others: they
  // start the next generation with whoever is left.
  for (int tries = 0;; ++tries) {
    try {
      State::Described restored;
      s.attempt(build, bytes, runtime::agree_options(s.link().config(), s.generation, s.members),
                &restored);
      out.step = restored.step;
      out.position = restored.position;
      break;
    } catch (const std::exception& e) {
      if (!is_peer_failure(e) || tries >= 8) throw;
      log(DOPT_LOG_WARN, "elastic",
          "recovery of generation " + std::to_string(s.generation) + " failed (" + e.what() +
              "); trying again with the ranks left");
      s.tear_down(&build, &bytes);
    }
  }
  // Commit at once in the new membership, so that the next failure rolls
  // back among these ranks (the old commit's buddies may be gone).
  const CheckpointExtra position = out.position;
  s.steps_at_commit = -1;
  s.commit(position);

  out.generation = s.generation;
  out.world_size = s.link().process().world_size;
  out.rank = s.link().process().rank;
  for (size_t i = 0; i < old_members.size(); ++i)
    if (std::find(s.members.begin(), s.members.end(), old_members[i]) == s.members.end())
      out.lost.push_back(static_cast<int>(i));
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  log(DOPT_LOG_INFO, "elastic",
      "generation " + std::to_string(out.generation) + ": rank " + std::to_string(out.old_rank) +
          " of " + std::to_string(out.old_world_size) + " is now rank " + std::to_string(out.rank) +
          " of " + std::to_string(out.world_size) + " (lost " + list(out.lost) +
          "), back at step " + std::to_string(out.step) + " in " + std::to_string(out.seconds) +
          " s");
  return out;
}

int64_t Elastic::generation() const { return s_->generation; }

int64_t Elastic::committed_step() const {
  return s_->commits.empty() ? -1 : s_->commits.back().step;
}

bool Elastic::flush(double timeout_s) {
  if (s_->commits.empty() || s_->commits.back().complete()) return true;
  return s_->commits.back().shift->wait_sent(static_cast<int64_t>(timeout_s * 1000));
}

uint64_t Elastic::commit_bytes() const {
  uint64_t n = 0;
  for (const Commit& c : s_->commits) n += c.own.data_bytes(true) + c.buddy.size();
  return n;
}

}  // namespace distopt
