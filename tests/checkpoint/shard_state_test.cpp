// The host's state writer (core/src/state/shard_state.*) and the SDK's
// replicated view of it (ABI 1.6 put_replicated): which rank keeps
// replicated state in a checkpoint and in an elastic commit, the SDK's
// fallback with a host before 1.6, and the flat encoding elastic commits
// and switches move between ranks.
#include <torch/torch.h>

#include "distopt/host_services.hpp"
#include "distopt/sdk/base/tensor_state.hpp"
#include "state/shard_state.hpp"
#include "torch_doctest.hpp"

using distopt::state::ShardState;
using distopt::state::StateEntry;

namespace {

const std::string kPrefix = "algorithm/";

// What a plugin of plain allreduce puts: replicated optimizer state, and
// one rank-local value.
void save_like_allreduce(ShardState& s, int rank, bool old_host = false) {
  dopt_state_writer c = s.writer(&kPrefix);
  if (old_host) c.struct_size = DOPT_STATE_WRITER_V1_1_STRUCT_SIZE;
  distopt::sdk::StateWriter w(c);
  distopt::sdk::StateWriter r = w.replicated(rank);
  distopt::sdk::put_whole(r, "optimizer/w/exp_avg", torch::arange(6, torch::kFloat).reshape({2, 3}));
  distopt::sdk::put_local(w, "error_feedback/w", torch::full({3}, static_cast<float>(rank)));
}

const StateEntry* find(const ShardState& s, const std::string& key) {
  for (const StateEntry& e : s.entries())
    if (e.key == key) return &e;
  return nullptr;
}

}  // namespace

TEST_CASE("checkpoint: rank 0 keeps replicated state as an ordinary entry, others copy none") {
  for (int rank : {0, 1}) {
    ShardState s;
    s.keep_replicas(false, rank);
    save_like_allreduce(s, rank);
    const StateEntry* e = find(s, "algorithm/optimizer/w/exp_avg");
    INFO("rank " << rank);
    CHECK((e != nullptr) == (rank == 0));
    if (e) {
      CHECK_FALSE(e->replicated);
      CHECK(e->kind == DOPT_STATE_SHARDED);
      CHECK(e->shape == std::vector<int64_t>{2, 3});
      CHECK(torch::equal(e->data, torch::arange(6, torch::kFloat)));
    }
    CHECK(find(s, "algorithm/error_feedback/w") != nullptr);
  }
}

TEST_CASE("elastic commit: every rank keeps its replicated copy, and packs only the rest") {
  ShardState s;
  s.keep_replicas(true, 2);
  save_like_allreduce(s, 2);
  const StateEntry* e = find(s, "algorithm/optimizer/w/exp_avg");
  REQUIRE(e != nullptr);
  CHECK(e->replicated);
  CHECK(s.data_bytes(true) == 6 * 4 + 3 * 4);
  CHECK(s.data_bytes(false) == 3 * 4);

  // Own part: the rank-local entry only; replicas: the other one; all: both.
  ShardState own = ShardState::unpack(s.pack(2, 4, ShardState::Part::own), "own", 2, 4);
  REQUIRE(own.entries().size() == 1);
  CHECK(own.entries()[0].key == "algorithm/error_feedback/w");
  CHECK(own.entries()[0].kind == DOPT_STATE_RANK_LOCAL);
  CHECK(torch::equal(own.entries()[0].data, torch::full({3}, 2.0f)));
  ShardState reps = ShardState::unpack(s.pack(2, 4, ShardState::Part::replicas), "reps", 2, 4);
  REQUIRE(reps.entries().size() == 1);
  CHECK(reps.entries()[0].replicated);
  CHECK(ShardState::unpack(s.pack(2, 4), "all", 2, 4).entries().size() == 2);

  // Merged into rank 0's piece as an ordinary entry (what a restore reads).
  ShardState piece0;
  piece0.add_replicas_of(s);
  REQUIRE(piece0.entries().size() == 1);
  CHECK_FALSE(piece0.entries()[0].replicated);
  CHECK(torch::equal(piece0.entries()[0].data, torch::arange(6, torch::kFloat)));
}

TEST_CASE("a host before ABI 1.6: the SDK puts replicated state from rank 0 only, with put") {
  for (int rank : {0, 3}) {
    ShardState s;
    s.keep_replicas(true, rank);  // ignored: the writer has no put_replicated
    save_like_allreduce(s, rank, true);
    const StateEntry* e = find(s, "algorithm/optimizer/w/exp_avg");
    INFO("rank " << rank);
    CHECK((e != nullptr) == (rank == 0));
    if (e) CHECK_FALSE(e->replicated);
  }
}

TEST_CASE("put_replicated refuses a piece, and replicated state before keep_replicas") {
  ShardState s;
  s.keep_replicas(true, 0);
  dopt_state_writer c = s.writer(&kPrefix);
  distopt::sdk::StateWriter r = distopt::sdk::StateWriter(c).replicated(0);
  CHECK_THROWS(distopt::sdk::put_sharded(r, "k", torch::ones({2}), 1, {4}));
  CHECK(distopt::take_last_error().find("put_replicated takes a whole") != std::string::npos);
  CHECK(s.entries().empty());
  ShardState unset;
  StateEntry e;
  e.key = "model/w";
  e.shape = {1};
  e.data = torch::ones({1});
  CHECK_THROWS_WITH(unset.add_replicated(e), doctest::Contains("keep_replicas"));
}

TEST_CASE("unpack names the bytes: truncated, or another rank's") {
  ShardState s;
  s.keep_replicas(true, 1);
  save_like_allreduce(s, 1);
  std::vector<char> bytes = s.pack(1, 2);
  CHECK_THROWS_WITH(ShardState::unpack(bytes, "the commit of rank 1", 0, 2),
                    doctest::Contains("the commit of rank 1: holds rank 1 of 2"));
  bytes.resize(bytes.size() - 5);
  CHECK_THROWS_WITH(ShardState::unpack(bytes, "the commit of rank 1", 1, 2),
                    doctest::Contains("truncated"));
}
