// The elastic membership's protocol between the launcher and the ranks: the
// environment an elastic launcher hands each rank, the member ids that name
// one process for a whole job, and the store keys both sides read and write
// (dead processes, joining processes, arriving nodes, each generation's
// agreement). `distopt launch --elastic` (tools/distopt/launch/) and the
// runtime (core/src/runtime/membership.cpp, elastic/) use these and nothing
// else, so the two sides cannot drift apart; an embedding program's own
// launcher can speak it too. The agreement itself (which ranks a new
// generation has) is the runtime's: distopt/elastic.hpp.
//
// Thread safety: pure functions, and Store calls (a Store is thread-safe).
// Errors: the Store's (RendezvousError naming the store) propagate.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/store.hpp"

namespace distopt::membership {

/// Environment an elastic launcher sets in each rank process.
/// "1": the launcher serves the store and records dead processes there
/// (record_dead), so survivors need not wait elastic.settle_s for them.
inline constexpr const char* kEnvAgent = "DISTOPT_ELASTIC";
/// The process's member id (member_id / joining_member_id), decimal.
inline constexpr const char* kEnvMember = "DISTOPT_ELASTIC_MEMBER";
/// "1": the process joins a running job (`distopt launch --elastic --join`).
inline constexpr const char* kEnvJoin = "DISTOPT_ELASTIC_JOIN";
/// The job's largest world (the launcher's --nnodes MAX x ranks per node).
inline constexpr const char* kEnvMaxRanks = "DISTOPT_ELASTIC_MAX_RANKS";

/// Member ids: a starting rank's is its first global rank plus this per
/// restart of its process, so every process of a job has its own.
inline constexpr int64_t kRestartStride = 1000000;
/// A joining process's ids start here (above any starting rank's).
inline constexpr int64_t kJoiningBase = 2000000000;

/// The member id of global rank `rank` (>= 0) after `restarts` restarts.
int64_t member_id(int rank, int restarts);
/// A new, job-unique member id for a joining process: kJoiningBase + n,
/// n from the store counter "elastic/join/ids" (one call, one id).
int64_t joining_member_id(Store& store);
/// True for ids joining_member_id gives.
bool is_joining_member(int64_t member);

/// The launcher's record that process `member` ended: "elastic/dead/<member>"
/// = `how` ("exit code 3"), and the counter "elastic/dead_count" + 1.
void record_dead(Store& store, int64_t member, const std::string& how);
/// Whether record_dead was called for `member` (does not wait).
bool is_recorded_dead(Store& store, int64_t member);
/// The number of record_dead calls of the job so far.
int64_t dead_count(Store& store);

/// The prefix of generation `generation`'s keys: "elastic/g<G>" (the
/// agreement's arrivals and decision, and the store prefix of that
/// generation's communicators).
std::string generation_prefix(int64_t generation);

/// Keys of processes that join a running job: the n-th asks at
/// join_request_key(n) (n from the counter kJoinCount) and is admitted at
/// join_request_key(n) + "/admitted"; kJoinAdmitted counts the admitted.
inline constexpr const char* kJoinCount = "elastic/join/count";
inline constexpr const char* kJoinAdmitted = "elastic/join/admitted";
std::string join_request_key(int64_t n);

/// Keys of a multi-node elastic start (launch --nnodes MIN:MAX): each
/// node's launcher adds 1 to kNodesArrived; node 0 writes how many nodes
/// started to kNodesStarted.
inline constexpr const char* kNodesArrived = "elastic/nodes/arrived";
inline constexpr const char* kNodesStarted = "elastic/nodes/started";

}  // namespace distopt::membership
