// `split` for communicators that bootstrap through the rendezvous store
// (`tcp`, `ucx`): every rank publishes "color key" under a per-split key,
// reads everyone's, and the members of its color, ordered by (key, old
// rank), form the new communicator under a store key prefix of their own (as MPI's
// MPI_Comm_split). The caller constructs its communicator from the
// returned create args. Header-only, torch-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/communicator.h"
#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk {

/// What a rank of the parent needs to construct its split communicator.
struct StoreSplit {
  bool member = false;  ///< false for color < 0: no new communicator
  int32_t rank = 0;     ///< in the new communicator
  int32_t world_size = 0;
  std::string scope;  ///< store key prefix of the new communicator (unique per split and color)
};

/// Collective over the parent's `world` ranks; `seq` counts this parent's
/// splits (identical on every rank), `prefix` is the parent's store key prefix.
/// Blocks up to `timeout_s` (seconds) per peer. Throws sdk::Error: COMM when
/// the store refuses the key, TIMEOUT (or COMM) naming the rank whose color
/// never arrived.
inline StoreSplit split_through_store(dopt_store* store, const std::string& prefix, int seq,
                                      int32_t rank, int32_t world, int32_t color, int32_t key,
                                      double timeout_s) {
  const std::string base = prefix + "/split/" + std::to_string(seq);
  const std::string mine = std::to_string(color) + " " + std::to_string(key);
  const std::string k = base + "/" + std::to_string(rank);
  if (world > 1 && host()->store_set(store, k.c_str(), mine.data(), mine.size()) != DOPT_OK)
    throw Error(DOPT_ERR_COMM, "split: cannot publish this rank's color under '" + k + "'");
  struct Member {
    int key, rank;
  };
  std::vector<Member> group;
  for (int p = 0; p < world; ++p) {
    int c = color, kk = key;
    if (p != rank) {
      const std::string pk = base + "/" + std::to_string(p);
      char buf[64];
      size_t len = 0;
      const dopt_status st = host()->store_get(store, pk.c_str(), buf, sizeof buf - 1, &len,
                                               static_cast<int64_t>(timeout_s * 1000));
      if (st != DOPT_OK || len >= sizeof buf)
        throw Error(
            st == DOPT_ERR_TIMEOUT ? DOPT_ERR_TIMEOUT : DOPT_ERR_COMM,
            "split: rank " + std::to_string(p) + " did not publish its color (key '" + pk + "')");
      buf[len] = 0;
      std::istringstream in(buf);
      in >> c >> kk;
    }
    if (c == color) group.push_back(Member{kk, p});
  }
  StoreSplit s;
  if (color < 0) return s;
  std::stable_sort(group.begin(), group.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  s.member = true;
  s.world_size = static_cast<int32_t>(group.size());
  for (size_t i = 0; i < group.size(); ++i)
    if (group[i].rank == rank) s.rank = static_cast<int32_t>(i);
  s.scope = base + "/color" + std::to_string(color);
  return s;
}

}  // namespace distopt::sdk
