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

#include "checkpoint/manifest.hpp"
#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "elastic/membership.hpp"
#include "host/services.hpp"
#include "optim/optimizer_impl.hpp"
#include "optim/rebuild.hpp"
#include "optim/snapshot.hpp"
#include "runtime/runtime_impl.hpp"
#include "state/exchange.hpp"
#include "state/shard_state.hpp"
#include "state/state_source.hpp"

namespace distopt {

namespace elastic {
struct Access {
  static Runtime::Impl& of(Runtime& rt) { return *rt.impl_; }
};
}  // namespace elastic

namespace {

using Clock = std::chrono::steady_clock;
using elastic::Arrival;
using elastic::CommitId;
using elastic::Decision;

// Tags of the buddy exchange on the control communicator (two: sizes, bytes).
constexpr int kCommitTag = 0x454c0000;

struct Commit {
  CommitId id;
  int rank = 0, world_size = 1;
  int64_t step = 0;
  checkpoint::Manifest manifest;
  CheckpointExtra position;
  std::vector<char> own;    // this rank's encoded state
  std::vector<char> buddy;  // rank (rank - 1) mod world_size's
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
    out.emplace_back(head[0], std::vector<char>(in.begin() + static_cast<std::ptrdiff_t>(at),
                                                in.begin() + static_cast<std::ptrdiff_t>(at) +
                                                    head[1]));
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
  Runtime& rt;
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
      : rt(r), model(m), opt(o), cfg(r.config().elastic), timeout_s(r.config().timeout_s) {}

  Runtime::Impl& runtime() { return elastic::Access::of(rt); }

  void commit(const CheckpointExtra& position) {
    Runtime::Impl& m = runtime();
    optim::OptimizerCheckpoint p(model, opt);
    Commit c;
    c.id = CommitId{generation, seq++};
    c.rank = m.proc.rank;
    c.world_size = m.proc.world_size;
    c.step = opt.steps();
    c.position = position;
    c.own = p.snapshot(c.rank).encode(c.rank, c.world_size);
    c.manifest = p.describe(c.world_size);
    if (c.world_size > 1)
      c.buddy = state::shift_bytes(c.own, m.control_comm().ref(), c.rank, c.world_size, kCommitTag);
    commits.push_back(std::move(c));
    while (commits.size() > 2) commits.pop_front();
    steps_at_commit = opt.steps();
  }

  // Drop the optimizer's components, then the communicators they used.
  void tear_down(optim::OptimizerBuild* build, uint64_t* bytes) {
    if (optim::Access::ptr(opt)) *build = optim::detach(opt, bytes);
    runtime().disconnect();
  }

  const Commit* held(const CommitId& id) const {
    for (const Commit& c : commits)
      if (c.id == id) return &c;
    return nullptr;
  }

  // Every survivor's pieces of the target commit to every survivor, then
  // the old world's shards, each from its owner or else its buddy.
  std::vector<state::ShardState> gather_shards(const Decision& d, const Commit& c, int rank,
                                               int world) {
    std::set<int> owners;
    for (const Arrival& a : d.members)
      for (const Arrival::Held& h : a.held)
        if (h.id == d.target) owners.insert(h.rank);
    std::vector<char> mine;
    put_piece(mine, c.rank, c.own);
    const int lent = (c.rank + c.world_size - 1) % c.world_size;
    if (c.world_size > 1 && !owners.count(lent)) put_piece(mine, lent, c.buddy);
    auto all = state::allgather_bytes(std::move(mine), runtime().control_comm().ref(), rank, world);
    std::vector<std::optional<state::ShardState>> shards(static_cast<size_t>(c.world_size));
    for (const auto& bytes : all)
      for (auto& [r, blob] : pieces_of(bytes)) {
        if (r < 0 || r >= c.world_size || shards[static_cast<size_t>(r)]) continue;
        shards[static_cast<size_t>(r)] = state::ShardState::decode(
            blob, "the in-memory commit of rank " + std::to_string(r), static_cast<int>(r),
            c.world_size);
      }
    std::vector<int> lost;
    for (int r = 0; r < c.world_size; ++r)
      if (!shards[static_cast<size_t>(r)]) lost.push_back(r);
    if (!lost.empty())
      throw ElasticError("elastic: the in-memory state of rank(s) " + list(lost) + " of " +
                         std::to_string(c.world_size) +
                         " was lost together with its buddy copy (held by rank (r + 1) mod " +
                         std::to_string(c.world_size) +
                         "); restore from the disk checkpoint (distopt train --resume)");
    std::vector<state::ShardState> out;
    for (auto& s : shards) out.push_back(std::move(*s));
    return out;
  }

  // One attempt: agree, reconnect, rebuild, restore. Returns the decision.
  Decision attempt(optim::OptimizerBuild& build, uint64_t bytes) {
    Runtime::Impl& m = runtime();
    Arrival me;
    me.member = member;
    me.rank = m.proc.rank;
    me.node = node;
    for (const Commit& c : commits) me.held.push_back({c.id, c.rank, c.world_size});
    elastic::AgreeOptions o;
    o.generation = generation;
    o.old_world_size = static_cast<int>(members.size());
    o.old_members = members;
    const char* agent = std::getenv("DISTOPT_ELASTIC");
    o.agent = agent && std::string(agent) == "1";
    o.settle = std::chrono::milliseconds(static_cast<int64_t>(cfg.settle_s * 1000));
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    maybe_die_in_recovery(member, "arrive");
    log(DOPT_LOG_DEBUG, "elastic",
        "recovery: rank " + std::to_string(me.rank) + " arrives at generation " +
            std::to_string(generation) + "'s agreement");
    Decision d = elastic::agree(*m.store, me, o);
    log(DOPT_LOG_DEBUG, "elastic",
        "recovery: generation " + std::to_string(d.generation) + " has " +
            std::to_string(d.members.size()) + " rank(s)");

    const int world = static_cast<int>(d.members.size());
    // From here on this rank belongs to generation d.generation, whatever fails.
    generation = d.generation;
    seq = 0;
    members.clear();
    int rank = 0, local_rank = 0, local_world = 0;
    for (int i = 0; i < world; ++i) {
      const Arrival& a = d.members[static_cast<size_t>(i)];
      members.push_back(a.member);
      if (a.member == member) rank = i;
    }
    for (int i = 0; i < world; ++i)
      if (d.members[static_cast<size_t>(i)].node == node) {
        if (i < rank) ++local_rank;
        ++local_world;
      }
    if (world < cfg.min_ranks)
      throw ElasticError("elastic: " + std::to_string(world) + " rank(s) survive, fewer than " +
                         "elastic.min_ranks = " + std::to_string(cfg.min_ranks) +
                         "; the job ends (restore from the disk checkpoint)");
    const Commit* c = held(d.target);
    if (!c) throw ElasticError("elastic: the agreed commit is not held here");  // cannot happen

    maybe_die_in_recovery(member, "connect");
    ProcessInfo p = m.proc;
    p.rank = rank;
    p.world_size = world;
    p.local_rank = local_rank;
    p.local_world_size = local_world;
    m.reconnect(p, "elastic/g" + std::to_string(generation));
    build.comm = m.comm->ref();
    build.comm_devices = m.comm->devices();
    build.control = m.control_comm().ref();
    build.common.rank = rank;
    build.common.world_size = world;
    build.common.local_rank = local_rank;
    build.common.local_world_size = local_world;
    // Store keys of the components: unique to this membership, whatever
    // each rank rebuilt before.
    const std::string base =
        build.scope.substr(0, std::min(build.scope.find("/elastic-g"), build.scope.find("/build-")));
    build.scope = base + "/elastic-g" + std::to_string(generation);
    build.rebuilds = 0;
    optim::reattach(opt, build, bytes);
    log(DOPT_LOG_DEBUG, "elastic", "recovery: communicators and optimizer rebuilt");

    std::vector<state::ShardState> shards = gather_shards(d, *c, rank, world);
    state::StateSource src(std::move(shards), rank, world);
    optim::OptimizerCheckpoint part(model, opt);
    const std::string where = "the in-memory commit of step " + std::to_string(c->step);
    part.resume(c->manifest, where);
    part.check_compatible(src, c->manifest, where);
    part.restore(src, c->manifest);
    return d;
  }
};

Elastic::Elastic(Runtime& rt, torch::nn::Module& model, DistributedOptimizer& opt)
    : s_(std::make_unique<State>(rt, model, opt)) {
  if (!rt.config().elastic.enabled)
    throw ConfigError(rt.config().path +
                      ": elastic.enabled is false; distopt::Elastic needs `elastic: {enabled: "
                      "true}` on every rank");
  s_->member = rt.rank();
  s_->node = elastic::node_name();
  for (int r = 0; r < rt.world_size(); ++r) s_->members.push_back(r);
}

Elastic::~Elastic() = default;

void Elastic::commit(const CheckpointExtra& position) { s_->commit(position); }

bool Elastic::maybe_commit(const CheckpointExtra& position) {
  const int64_t steps = s_->opt.steps();
  if (s_->steps_at_commit >= 0 && steps - s_->steps_at_commit < s_->cfg.commit_every) return false;
  if (steps == s_->steps_at_commit) return false;
  s_->commit(position);
  return true;
}

Elastic::Recovery Elastic::recover() {
  State& s = *s_;
  const auto t0 = Clock::now();
  Recovery out;
  out.old_world_size = s.rt.world_size();
  out.old_rank = s.rt.rank();
  const std::vector<int64_t> old_members = s.members;
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
      Decision d = s.attempt(build, bytes);
      const Commit* c = s.held(d.target);
      out.step = c->step;
      out.position = c->position;
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
  out.world_size = s.rt.world_size();
  out.rank = s.rt.rank();
  for (size_t i = 0; i < old_members.size(); ++i)
    if (std::find(s.members.begin(), s.members.end(), old_members[i]) == s.members.end())
      out.lost.push_back(static_cast<int>(i));
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  log(DOPT_LOG_INFO, "elastic",
      "generation " + std::to_string(out.generation) + ": rank " + std::to_string(out.old_rank) +
          " of " + std::to_string(out.old_world_size) + " is now rank " +
          std::to_string(out.rank) + " of " + std::to_string(out.world_size) + " (lost " +
          list(out.lost) + "), back at step " + std::to_string(out.step) + " in " +
          std::to_string(out.seconds) + " s");
  return out;
}

int64_t Elastic::generation() const { return s_->generation; }

int64_t Elastic::committed_step() const {
  return s_->commits.empty() ? -1 : s_->commits.back().step;
}

uint64_t Elastic::commit_bytes() const {
  uint64_t n = 0;
  for (const Commit& c : s_->commits) n += c.own.size() + c.buddy.size();
  return n;
}

}  // namespace distopt
