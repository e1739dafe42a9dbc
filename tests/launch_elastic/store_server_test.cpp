// StoreServer (a tcp:// store served by a process that is no rank, the
// elastic launcher) and the clients that only connect to it:
// StoreOptions::serve = false and DISTOPT_STORE_SERVED=1.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>

#include "distopt/error.hpp"
#include "distopt/store.hpp"

using namespace distopt;
using namespace std::chrono_literals;

namespace {

StoreOptions client(int port, int rank, const std::string& token) {
  StoreOptions o;
  o.url = "tcp://127.0.0.1:" + std::to_string(port);
  o.rank = rank;
  o.world_size = 2;
  o.token = token;
  o.timeout = 2s;
  return o;
}

}  // namespace

TEST_CASE("StoreServer serves rank 0 and rank 1 as clients and outlives them") {
  auto server = StoreServer::start("127.0.0.1", 0, "tok");
  const int port = server->port();
  REQUIRE(port > 0);
  {
    StoreOptions o0 = client(port, 0, "tok");
    o0.serve = false;
    auto rank0 = make_store(o0);
    auto rank1 = make_store(client(port, 1, "tok"));
    rank0->set("k", std::string("v"));
    CHECK(rank1->get_string("k") == "v");
    CHECK(rank1->add("n", 2) == 2);
  }  // both clients gone; the data stays with the server
  auto again = make_store(client(port, 1, "tok"));
  CHECK(again->get_string("k") == "v");
  CHECK(again->add("n", 1) == 3);
  // Rank 0 that serves cannot bind the port the server holds: the error names it.
  try {
    make_store(client(port, 0, "tok"));
    FAIL("rank 0 bound a port that is in use");
  } catch (const RendezvousError& e) {
    CHECK(std::string(e.what()).find(std::to_string(port)) != std::string::npos);
  }
  CHECK_THROWS_AS(make_store(client(port, 1, "other")), RendezvousError);  // wrong token
  server.reset();
  CHECK_THROWS_AS(again->get("k", 1s), RendezvousError);  // the connection is closed
}

TEST_CASE("DISTOPT_STORE_SERVED=1 makes rank 0 a client only") {
  auto server = StoreServer::start("127.0.0.1", 0, "tok");
  REQUIRE(setenv("DISTOPT_STORE_SERVED", "1", 1) == 0);
  auto rank0 = make_store(client(server->port(), 0, "tok"));  // serve = true, overridden
  unsetenv("DISTOPT_STORE_SERVED");
  rank0->set("k", std::string("from rank 0"));
  auto rank1 = make_store(client(server->port(), 1, "tok"));
  CHECK(rank1->get_string("k") == "from rank 0");
}

TEST_CASE("StoreServer::start names the address it cannot bind") {
  auto first = StoreServer::start("127.0.0.1", 0, "tok");
  try {
    StoreServer::start("127.0.0.1", first->port(), "tok");
    FAIL("a second server bound the same port");
  } catch (const RendezvousError& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(first->port())) !=
          std::string::npos);
  }
}
