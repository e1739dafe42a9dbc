// Private: the survivors' agreement on a new membership after a failure,
// through the rendezvous store (torchft's quorum, TorchElastic's
// rendezvous round). Torch-free.
//
// Keys, under "elastic/g<G>/" for the generation G being left:
//   arrived            counter; the n-th arrival writes arrival/<n>
//   arrival/<n>        "member rank node commit..." (Arrival::encode)
//   closed             the number of arrivals the membership took
//   decision           the new membership (Decision::encode)
// and, recorded by the elastic launcher when a rank's process ends, the
// dead members (membership::record_dead). Member ids, those records and the
// launcher's environment are the launcher-rank protocol of
// distopt/elastic_membership.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/process.hpp"
#include "distopt/store.hpp"

namespace distopt::runtime {

/// A commit's identity: the generation it was made in and its number
/// there; ranks commit together, so equal ids mean the same commit.
struct CommitId {
  int64_t generation = -1;
  int64_t seq = -1;
  bool valid() const { return seq >= 0; }
  bool operator==(const CommitId& o) const { return generation == o.generation && seq == o.seq; }
  bool operator<(const CommitId& o) const {
    return generation != o.generation ? generation < o.generation : seq < o.seq;
  }
};

/// What a survivor brings to the agreement.
struct Arrival {
  int64_t member = 0;  ///< stable id of the process (see the top of this file)
  int rank = 0;        ///< its rank in the generation being left
  std::string node;    ///< host identity (local ranks are counted per node)
  /// The commits it holds, with its rank and world size in each.
  struct Held {
    CommitId id;
    int rank = 0, world_size = 0;
  };
  std::vector<Held> held;
  std::string encode() const;
  static Arrival decode(const std::string& s);
};

/// The new membership: members in their old rank order (index = new rank).
struct Decision {
  int64_t generation = 0;  ///< the new one
  CommitId target;         ///< the newest commit every member holding any holds
  std::vector<Arrival> members;
  std::string encode() const;
  static Decision decode(const std::string& s);
};

struct AgreeOptions {
  int64_t generation = 0;                  ///< the generation being left
  int old_world_size = 1;                  ///< its members (arrivals expected)
  std::vector<int64_t> old_members;        ///< their member ids, in old rank order
  bool agent = false;                      ///< the launcher declares dead ranks (DISTOPT_ELASTIC=1)
  std::chrono::milliseconds settle{2000};  ///< without an agent: close after this
  std::chrono::milliseconds timeout{60000};  ///< at most this for anything
};

/// The agreement's settings for a job: world.timeout_s, elastic.settle_s,
/// and agent = DISTOPT_ELASTIC=1 (the elastic launcher records dead ranks).
AgreeOptions agree_options(const JobConfig& cfg, int64_t generation,
                           const std::vector<int64_t>& members);

/// What the running ranks' rank 0 writes to a joining rank's key
/// ("elastic/join/<n>/admitted") when they take it in at a commit: the
/// generation being left and every member of the agreement (the running
/// ranks in rank order, then the ranks joining).
struct Admission {
  int64_t generation = 0;
  std::vector<int64_t> members;
  std::string encode() const;
  static Admission decode(const std::string& s);
  AgreeOptions options(const JobConfig& cfg) const {
    return agree_options(cfg, generation, members);
  }
};

/// This process's rank, world size, local rank and local world size in
/// decision `d` (members on `node` count as local).
void place(const Decision& d, int64_t member, const std::string& node, ProcessInfo& p);

/// Arrive at generation opts.generation's recovery and return the decision.
/// The first arrival closes the membership when every old member has
/// arrived or (agent) been declared dead, else at the settle time (no
/// agent) or the timeout (agent); then it decides. Throws ElasticError for
/// an arrival after closing, no commit held by every member, or no
/// decision within the timeout (the deciding rank died: the caller tries
/// the next generation); RendezvousError when the store is gone.
Decision agree(Store& store, const Arrival& me, const AgreeOptions& opts);

/// This host's identity: DISTOPT_NODE_ID when set, else the host name.
std::string node_name();

}  // namespace distopt::runtime
