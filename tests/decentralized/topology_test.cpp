// The mixing matrices of the decentralized plugin's topologies (torch-free,
// compiles the plugin's topology.cpp): symmetric and doubly stochastic for
// every world size, shift_one's published schedule (Bagua), and the
// refusals (odd world for shift_one, asymmetric / disconnected lists).
#include "topology.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using distopt::plugins::decentralized::MixingRow;
using distopt::plugins::decentralized::Topology;

namespace {

// W as a dense matrix for round `round`.
std::vector<std::vector<double>> matrix(const Topology& t, int n, int64_t round) {
  std::vector<std::vector<double>> w(n, std::vector<double>(n, 0.0));
  for (int r = 0; r < n; ++r) {
    const MixingRow row = t.row(r, round);
    if (row.average_all) {
      for (int c = 0; c < n; ++c) w[r][c] = 1.0 / n;
      continue;
    }
    w[r][r] += row.self_weight;
    for (const auto& l : row.links) w[r][l.peer] += l.weight;
  }
  return w;
}

void check_doubly_stochastic(const Topology& t, int n, int64_t round) {
  CAPTURE(t.kind());
  CAPTURE(n);
  CAPTURE(round);
  const auto w = matrix(t, n, round);
  for (int i = 0; i < n; ++i) {
    double row = 0, col = 0;
    for (int j = 0; j < n; ++j) {
      row += w[i][j];
      col += w[j][i];
      CHECK(w[i][j] >= 0);
      CHECK(w[i][j] == doctest::Approx(w[j][i]).epsilon(1e-15));  // symmetric
    }
    CHECK(row == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(col == doctest::Approx(1.0).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("every topology's mixing matrix is symmetric and doubly stochastic") {
  for (int n = 1; n <= 9; ++n) {
    for (const char* kind : {"ring", "complete", "exponential"})
      for (int64_t round : {0, 1, 5}) check_doubly_stochastic(Topology(kind, "", n), n, round);
    if (n % 2 == 0)
      for (int64_t round = 0; round < n; ++round)
        check_doubly_stochastic(Topology("shift_one", "", n), n, round);
  }
  // An irregular graph (a star with an extra edge): Metropolis-Hastings weights.
  const Topology star("neighbors", "0:1,2,3; 1:0; 2:0,3; 3:0,2", 4);
  check_doubly_stochastic(star, 4, 0);
  const MixingRow r1 = star.row(1, 0);
  REQUIRE(r1.links.size() == 1);
  CHECK(r1.links[0].peer == 0);
  CHECK(r1.links[0].weight == doctest::Approx(1.0 / 4));  // 1 / (1 + max(1, 3))
  CHECK(r1.self_weight == doctest::Approx(3.0 / 4));
}

TEST_CASE("ring: weights 1/3 with left and right, 1/2 for two ranks") {
  const MixingRow r = Topology("ring", "", 5).row(0, 0);
  REQUIRE(r.links.size() == 2);
  CHECK(r.links[0].peer == 1);
  CHECK(r.links[1].peer == 4);
  for (const auto& l : r.links) CHECK(l.weight == doctest::Approx(1.0 / 3));
  CHECK(r.self_weight == doctest::Approx(1.0 / 3));
  const MixingRow two = Topology("ring", "", 2).row(1, 0);
  REQUIRE(two.links.size() == 1);
  CHECK(two.links[0].weight == 0.5);
  CHECK(Topology("ring", "", 1).row(0, 0).links.empty());
}

TEST_CASE("exponential: peers at distance 2^k both ways") {
  const MixingRow r = Topology("exponential", "", 8).row(0, 0);
  std::set<int> peers;
  for (const auto& l : r.links) peers.insert(l.peer);
  CHECK(peers == std::set<int>{1, 2, 4, 6, 7});
}

TEST_CASE("shift_one follows Bagua's schedule: a rotating matching of the two halves") {
  for (int n : {2, 4, 6, 8}) {
    const int half = n / 2;
    std::set<std::pair<int, int>> met;
    for (int64_t round = 0; round < 3 * n; ++round) {
      for (int r = 0; r < n; ++r) {
        const int p = Topology::shift_one_peer(r, round, n);
        // The published formula (bagua-core's decentralized ops).
        const int expected = r < half
                                 ? static_cast<int>((round + r) % ((n + 1) / 2)) + half
                                 : static_cast<int>((((r - half - round) % half) + half) % half);
        CHECK(p == expected);
        CHECK(Topology::shift_one_peer(p, round, n) == r);  // a matching
        CHECK((r < half) != (p < half));                    // across the halves
        met.insert({std::min(r, p), std::max(r, p)});
      }
    }
    CHECK(met.size() == static_cast<size_t>(half * half));  // every lower/upper pair meets
  }
}

TEST_CASE("bad topologies are refused with a reason") {
  auto message = [](const std::string& kind, const std::string& nb, int n) {
    try {
      Topology(kind, nb, n);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message("shift_one", "", 3).find("even world size") != std::string::npos);
  CHECK(
      message("neighbors", "0:1; 1:2; 2:1", 3).find("rank 0 lists 1 but rank 1 does not list 0") !=
      std::string::npos);
  CHECK(message("neighbors", "0:1; 1:0; 2:3; 3:2", 4).find("cannot be reached") !=
        std::string::npos);
  CHECK(message("neighbors", "0:1; 1:0,7", 2).find("not a rank") != std::string::npos);
  CHECK(message("neighbors", "0:0", 1).find("itself") != std::string::npos);
  CHECK(message("neighbors", "0 1", 2).find("expected") != std::string::npos);
  CHECK(message("torus", "", 4).find("unknown topology") != std::string::npos);
  CHECK(message("neighbors", "0:1; 1:0", 2) == "accepted");
}
