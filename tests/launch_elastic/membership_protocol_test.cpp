// The elastic membership's launcher-rank protocol (distopt/elastic_membership.hpp)
// over a real tcp:// store, without rank processes: member ids, the
// launcher's record of a dead process, and the runtime's agreement
// (core/src/runtime/membership.hpp) closing on that record at once instead
// of waiting elastic.settle_s.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <set>
#include <string>

#include "distopt/elastic_membership.hpp"
#include "distopt/store.hpp"
#include "runtime/membership.hpp"

using namespace distopt;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<Store> client(int port) {
  StoreOptions o;
  o.url = "tcp://127.0.0.1:" + std::to_string(port);
  o.rank = 1;
  o.world_size = 2;
  o.token = "tok";
  o.timeout = 10s;
  o.serve = false;
  return make_store(o);
}

}  // namespace

TEST_CASE("member ids: one per process of the job, joining ones apart") {
  std::set<int64_t> ids;
  for (int rank = 0; rank < 64; ++rank)
    for (int restarts = 0; restarts < 5; ++restarts) {
      const int64_t id = membership::member_id(rank, restarts);
      CHECK(ids.insert(id).second);
      CHECK_FALSE(membership::is_joining_member(id));
    }
  auto server = StoreServer::start("127.0.0.1", 0, "tok");
  auto launcher = client(server->port()), other_launcher = client(server->port());
  const int64_t a = membership::joining_member_id(*launcher);
  const int64_t b = membership::joining_member_id(*other_launcher);
  CHECK(a != b);
  CHECK(membership::is_joining_member(a));
  CHECK(membership::is_joining_member(b));
  CHECK(ids.count(a) == 0);
}

TEST_CASE("a dead process the launcher records is what the ranks read") {
  auto server = StoreServer::start("127.0.0.1", 0, "tok");
  auto launcher = client(server->port()), rank = client(server->port());
  CHECK(membership::dead_count(*rank) == 0);
  CHECK_FALSE(membership::is_recorded_dead(*rank, 7));
  membership::record_dead(*launcher, 7, "exit code 3");
  CHECK(membership::is_recorded_dead(*rank, 7));
  CHECK_FALSE(membership::is_recorded_dead(*rank, 8));
  CHECK(membership::dead_count(*rank) == 1);
  CHECK(membership::generation_prefix(3) == "elastic/g3");
  CHECK(membership::join_request_key(2) != membership::join_request_key(3));
}

TEST_CASE("the agreement closes on the launcher's record instead of waiting for the dead") {
  auto server = StoreServer::start("127.0.0.1", 0, "tok");
  auto launcher = client(server->port());
  const std::vector<int64_t> members = {membership::member_id(0, 0), membership::member_id(1, 0),
                                        membership::member_id(2, 0)};
  // Rank 2's process died; its launcher says so.
  membership::record_dead(*launcher, members[2], "killed by signal 9");
  runtime::AgreeOptions o;
  o.generation = 0;
  o.old_world_size = 3;
  o.old_members = members;
  o.agent = true;  // the elastic launcher records dead processes
  // Without the record the first arrival would wait for rank 2 until this
  // timeout, past ctest's: returning at all shows the record closed it.
  o.settle = 1000000ms;
  o.timeout = 1000000ms;
  auto arrive = [&](int r) {
    runtime::Arrival me;
    me.member = members[static_cast<size_t>(r)];
    me.rank = r;
    me.node = "n";
    me.held.push_back({runtime::CommitId{0, 0}, r, 3});  // both hold the generation's first commit
    auto store = client(server->port());
    return runtime::agree(*store, me, o);
  };
  auto d0 = std::async(std::launch::async, arrive, 0);
  auto d1 = std::async(std::launch::async, arrive, 1);
  const runtime::Decision a = d0.get(), b = d1.get();
  CHECK(a.generation == 1);
  CHECK(a.encode() == b.encode());
  REQUIRE(a.members.size() == 2);
  CHECK(a.members[0].member == members[0]);
  CHECK(a.members[1].member == members[1]);
}
