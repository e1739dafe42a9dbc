// The `hierarchical` reducer's node layout and ring cut (torch-free; compiles
// the plugin's node_layout.cpp): DISTOPT_NODE_ID parsing, node numbering on
// equal, unequal and interleaved layouts, and that the pieces of every
// bucket size cover it once, with every node holding every piece once.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "node_layout.hpp"

using namespace distopt::plugins::hierarchical;

TEST_CASE("DISTOPT_NODE_ID: one name, a list with one per rank, or the host name") {
  CHECK(node_name(3, 4, "nodeB") == "nodeB");
  CHECK(node_name(0, 4, "a,a,b,b") == "a");
  CHECK(node_name(2, 4, "a, a, b ,b") == "b");
  CHECK_THROWS_WITH_AS(node_name(3, 4, "a,a,b"), doctest::Contains("lists 3 node names for 4"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(node_name(1, 2, "a,"), doctest::Contains("empty node name"),
                       std::invalid_argument);
  CHECK_THROWS_AS(node_name(0, 1, ""), std::invalid_argument);
  CHECK_FALSE(node_name(0, 1, nullptr).empty());  // the host name
  CHECK(node_key("a") == node_key("a"));
  CHECK(node_key("a") != node_key("b"));
}

TEST_CASE("layouts: nodes numbered by their lowest rank, local ranks by rank") {
  const int64_t a = node_key("a"), b = node_key("b"), c = node_key("c");
  SUBCASE("2 x 2") {
    NodeLayout l = make_layout({a, a, b, b}, 3);
    CHECK(l.num_nodes() == 2);
    CHECK(l.node() == 1);
    CHECK(l.local() == 1);
    CHECK(l.local_size() == 2);
    CHECK(l.members == std::vector<std::vector<int32_t>>{{0, 1}, {2, 3}});
    CHECK(l.describe() == "2 nodes of 2+2 ranks");
  }
  SUBCASE("interleaved: the node of rank 0 is node 0 whatever its name") {
    NodeLayout l = make_layout({b, a, b, a}, 1);
    CHECK(l.node_of == std::vector<int32_t>{0, 1, 0, 1});
    CHECK(l.local_of == std::vector<int32_t>{0, 0, 1, 1});
    CHECK(l.node() == 1);
    CHECK(l.local() == 0);
  }
  SUBCASE("unequal: 3 + 1, and 1 + 2 + 1") {
    NodeLayout l = make_layout({a, a, a, b}, 3);
    CHECK(l.node_size == std::vector<int32_t>{3, 1});
    CHECK(l.max_local_size() == 3);
    CHECK(l.local_size() == 1);
    NodeLayout m = make_layout({c, a, a, b}, 2);
    CHECK(m.node_size == std::vector<int32_t>{1, 2, 1});
    CHECK(m.local() == 1);
    CHECK(m.describe() == "3 nodes of 1+2+1 ranks");
  }
  CHECK_THROWS_AS(make_layout({a, b}, 2), std::invalid_argument);
}

TEST_CASE("ring pieces cover every bucket once, and every node holds every piece once") {
  for (int32_t max_local : {1, 2, 3, 4})
    for (int32_t local = 1; local <= max_local; ++local)
      for (size_t numel : {size_t(0), size_t(1), size_t(2), size_t(7), size_t(12), size_t(1001)}) {
        CAPTURE(max_local);
        CAPTURE(local);
        CAPTURE(numel);
        const PiecePlan p(numel, max_local, local);
        CHECK(p.pieces == static_cast<size_t>(max_local));
        CHECK(p.piece * p.pieces >= numel);
        CHECK(p.slots * static_cast<size_t>(local) >= p.pieces);
        // Pieces tile [0, numel) in order.
        size_t end = 0;
        for (size_t k = 0; k < p.pieces; ++k) {
          CHECK(p.first(k) == end);
          CHECK(p.last(k) - p.first(k) <= p.piece);
          end = p.last(k);
        }
        CHECK(end == numel);
        // The node's local ranks hold each piece exactly once, in slot k / L of rank k % L.
        std::multiset<int64_t> held;
        for (int32_t j = 0; j < local; ++j)
          for (size_t s = 0; s < p.slots; ++s)
            if (const int64_t k = p.piece_at(j, s); k >= 0) {
              held.insert(k);
              CHECK(PiecePlan::holder(static_cast<size_t>(k), local) == j);
            }
        CHECK(held.size() == p.pieces);
        CHECK(std::set<int64_t>(held.begin(), held.end()).size() == p.pieces);
        CHECK(p.in_place() == (local == max_local && numel == p.pieces * p.piece));
      }
}
