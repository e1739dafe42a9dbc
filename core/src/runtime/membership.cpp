// The store protocol of membership.hpp.
#include "runtime/membership.hpp"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>
#include <thread>

#include "distopt/elastic_membership.hpp"
#include "distopt/error.hpp"
#include "distopt/host_services.hpp"

namespace distopt::runtime {

namespace {

using Clock = std::chrono::steady_clock;

std::string key_of(int64_t generation, const std::string& what) {
  return membership::generation_prefix(generation) + "/" + what;
}

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::string ids(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

Arrival parse_arrival(std::istream& in, const std::string& whole) {
  Arrival a;
  size_t n = 0;
  if (!(in >> a.member >> a.rank >> a.node >> n))
    throw ElasticError("elastic: malformed arrival record '" + whole + "' in the store");
  for (size_t i = 0; i < n; ++i) {
    Arrival::Held h;
    if (!(in >> h.id.generation >> h.id.seq >> h.rank >> h.world_size))
      throw ElasticError("elastic: malformed arrival record '" + whole + "' in the store");
    a.held.push_back(h);
  }
  return a;
}

// The newest commit every arrival holds (invalid when there is none).
CommitId common_commit(const std::vector<Arrival>& members) {
  CommitId best;
  // Ranks joining hold no commit: they take theirs from the others.
  const Arrival* first = nullptr;
  for (const Arrival& a : members)
    if (!a.held.empty() && !first) first = &a;
  if (!first) return best;
  for (const Arrival::Held& h : first->held) {
    bool everywhere = true;
    for (const Arrival& a : members)
      everywhere =
          everywhere &&
          (a.held.empty() || std::any_of(a.held.begin(), a.held.end(),
                                         [&](const Arrival::Held& x) { return x.id == h.id; }));
    if (everywhere && (!best.valid() || best < h.id)) best = h.id;
  }
  return best;
}

// The first arrival: wait for the others (or their death), close, decide.
void close_and_decide(Store& store, const AgreeOptions& o) {
  const auto start = Clock::now();
  const std::string arrived_key = key_of(o.generation, "arrived");
  // Why it closed, for the log: an operator tells a prompt recovery from
  // one that waited out world.timeout_s for a process nobody recorded dead.
  std::string why;
  std::vector<int64_t> dead;
  // Agent: the members that arrived so far (a dead record of one of them,
  // e.g. one written under a wrong id, must not stand for another member).
  std::set<int64_t> arrived_members;
  int64_t read = 0;
  for (;;) {
    const int64_t arrived = store.add(arrived_key, 0);
    if (arrived >= o.old_world_size) {
      why = "every member arrived";
      break;
    }
    const auto waited = Clock::now() - start;
    if (o.agent) {
      for (; read < arrived; ++read)  // each arrival's record follows its count at once
        arrived_members.insert(
            Arrival::decode(
                text(store.get(key_of(o.generation, "arrival/" + std::to_string(read + 1)),
                               std::chrono::milliseconds(o.timeout))))
                .member);
      dead.clear();
      for (int64_t m : o.old_members)
        if (!arrived_members.count(m) && membership::is_recorded_dead(store, m)) dead.push_back(m);
      if (static_cast<int64_t>(arrived_members.size() + dead.size()) >= o.old_world_size) {
        why = "the others were recorded dead by the launcher";
        break;
      }
    } else if (waited >= o.settle) {
      why = "elastic.settle_s passed";
      break;
    }
    if (waited >= o.timeout) {
      why = "world.timeout_s passed, with members neither arrived nor recorded dead";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int64_t closed = store.add(arrived_key, 0);
  log(DOPT_LOG_INFO, "elastic",
      "generation " + std::to_string(o.generation) + "'s membership closed after " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
          " ms with " + std::to_string(closed) + " of " + std::to_string(o.old_world_size) +
          " member(s) arrived, recorded dead: " + (dead.empty() ? "none" : ids(dead)) + "; " + why);
  store.set(key_of(o.generation, "closed"), std::to_string(closed));
  Decision d;
  d.generation = o.generation + 1;
  std::set<int64_t> seen;
  for (int64_t n = 1; n <= closed; ++n) {
    const std::string s = text(store.get(key_of(o.generation, "arrival/" + std::to_string(n)),
                                         std::chrono::milliseconds(o.timeout)));
    Arrival a = Arrival::decode(s);
    if (seen.insert(a.member).second) d.members.push_back(std::move(a));
  }
  std::sort(d.members.begin(), d.members.end(),
            [](const Arrival& a, const Arrival& b) { return a.rank < b.rank; });
  d.target = common_commit(d.members);
  store.set(key_of(o.generation, "decision"), d.encode());
}

}  // namespace

std::string Arrival::encode() const {
  std::ostringstream os;
  os << member << ' ' << rank << ' ' << node << ' ' << held.size();
  for (const Held& h : held)
    os << ' ' << h.id.generation << ' ' << h.id.seq << ' ' << h.rank << ' ' << h.world_size;
  return os.str();
}

Arrival Arrival::decode(const std::string& s) {
  std::istringstream in(s);
  return parse_arrival(in, s);
}

std::string Decision::encode() const {
  std::ostringstream os;
  os << generation << ' ' << target.generation << ' ' << target.seq << ' ' << members.size()
     << '\n';
  for (const Arrival& a : members) os << a.encode() << '\n';
  return os.str();
}

Decision Decision::decode(const std::string& s) {
  std::istringstream in(s);
  Decision d;
  size_t n = 0;
  if (!(in >> d.generation >> d.target.generation >> d.target.seq >> n))
    throw ElasticError("elastic: malformed decision record in the store");
  for (size_t i = 0; i < n; ++i) d.members.push_back(parse_arrival(in, s));
  return d;
}

Decision agree(Store& store, const Arrival& me, const AgreeOptions& o) {
  const int64_t n = store.add(key_of(o.generation, "arrived"), 1);
  store.set(key_of(o.generation, "arrival/" + std::to_string(n)), me.encode());
  if (n == 1) close_and_decide(store, o);
  std::string s;
  const auto wait = o.timeout + (o.agent ? std::chrono::milliseconds(0) : o.settle) +
                    std::chrono::milliseconds(5000);
  try {
    s = text(store.get(key_of(o.generation, "decision"), wait));
  } catch (const RendezvousError&) {
    throw ElasticError("elastic: no membership was decided for generation " +
                       std::to_string(o.generation + 1) + " within " +
                       std::to_string(wait.count()) +
                       " ms (the rank deciding it died during the recovery)");
  }
  Decision d = Decision::decode(s);
  const bool in = std::any_of(d.members.begin(), d.members.end(),
                              [&](const Arrival& a) { return a.member == me.member; });
  if (!in)
    throw ElasticError("elastic: rank " + std::to_string(me.rank) + " (member " +
                       std::to_string(me.member) + ") reached the recovery of generation " +
                       std::to_string(o.generation + 1) + " after its membership closed with " +
                       std::to_string(d.members.size()) + " rank(s); it leaves the job");
  if (!d.target.valid())
    throw ElasticError("elastic: the " + std::to_string(d.members.size()) +
                       " surviving rank(s) hold no common in-memory commit (a rank died before "
                       "the first commit, or ranks stopped more than one commit apart); restore "
                       "from the disk checkpoint");
  return d;
}

AgreeOptions agree_options(const JobConfig& cfg, int64_t generation,
                           const std::vector<int64_t>& members) {
  AgreeOptions o;
  o.generation = generation;
  o.old_world_size = static_cast<int>(members.size());
  o.old_members = members;
  const char* agent = std::getenv(membership::kEnvAgent);
  o.agent = agent && std::string(agent) == "1";
  o.settle = std::chrono::milliseconds(static_cast<int64_t>(cfg.elastic.settle_s * 1000));
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_s * 1000));
  return o;
}

std::string Admission::encode() const {
  std::ostringstream os;
  os << generation << ' ' << members.size();
  for (int64_t m : members) os << ' ' << m;
  return os.str();
}

Admission Admission::decode(const std::string& s) {
  std::istringstream in(s);
  Admission a;
  size_t n = 0;
  if (!(in >> a.generation >> n))
    throw ElasticError("elastic: malformed admission record '" + s + "'");
  for (size_t i = 0; i < n; ++i) {
    int64_t m = 0;
    if (!(in >> m)) throw ElasticError("elastic: malformed admission record '" + s + "'");
    a.members.push_back(m);
  }
  return a;
}

void place(const Decision& d, int64_t member, const std::string& node, ProcessInfo& p) {
  const int world = static_cast<int>(d.members.size());
  int rank = -1, local_rank = 0, local_world = 0;
  for (int i = 0; i < world; ++i)
    if (d.members[static_cast<size_t>(i)].member == member) rank = i;
  for (int i = 0; i < world; ++i)
    if (d.members[static_cast<size_t>(i)].node == node) {
      if (i < rank) ++local_rank;
      ++local_world;
    }
  p.rank = rank;
  p.world_size = world;
  p.local_rank = local_rank;
  p.local_world_size = local_world;
}

std::string node_name() {
  if (const char* n = std::getenv("DISTOPT_NODE_ID"); n && *n) return n;
  char host[HOST_NAME_MAX + 1] = {0};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  std::string s = host;
  for (char& c : s)
    if (c == ' ' || c == '\n') c = '_';
  return s.empty() ? "localhost" : s;
}

}  // namespace distopt::runtime
