#include "topology.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace distopt::plugins::decentralized {
namespace {

using Graph = std::vector<std::vector<int32_t>>;

void add_edge(Graph& g, int32_t a, int32_t b) {
  if (a == b) return;
  if (std::find(g[a].begin(), g[a].end(), b) == g[a].end()) g[a].push_back(b);
  if (std::find(g[b].begin(), g[b].end(), a) == g[b].end()) g[b].push_back(a);
}

Graph ring(int32_t n) {
  Graph g(n);
  for (int32_t r = 0; r < n; ++r) add_edge(g, r, (r + 1) % n);
  return g;
}

Graph exponential(int32_t n) {
  Graph g(n);
  for (int32_t r = 0; r < n; ++r)
    for (int64_t d = 1; d < n; d *= 2) add_edge(g, r, static_cast<int32_t>((r + d) % n));
  return g;
}

void check_symmetric_connected(const Graph& g) {
  const int32_t n = static_cast<int32_t>(g.size());
  for (int32_t a = 0; a < n; ++a)
    for (int32_t b : g[a])
      if (std::find(g[b].begin(), g[b].end(), a) == g[b].end())
        throw std::invalid_argument("rank " + std::to_string(a) + " lists " + std::to_string(b) +
                                    " but rank " + std::to_string(b) + " does not list " +
                                    std::to_string(a) + " (the graph must be symmetric)");
  std::vector<bool> seen(n, false);
  std::vector<int32_t> frontier{0};  // depth-first search from rank 0
  seen[0] = true;
  while (!frontier.empty()) {
    const int32_t a = frontier.back();
    frontier.pop_back();
    for (int32_t b : g[a]) {
      if (seen[b]) continue;
      seen[b] = true;
      frontier.push_back(b);
    }
  }
  for (int32_t r = 0; r < n; ++r)
    if (!seen[r])
      throw std::invalid_argument("rank " + std::to_string(r) +
                                  " cannot be reached from rank 0 (the graph must be connected, "
                                  "or the replicas never agree)");
}

int32_t parse_rank(const std::string& s, int32_t n, const std::string& part) {
  size_t used = 0;
  long v = -1;
  try {
    v = std::stol(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v < 0 || v >= n)
    throw std::invalid_argument("'" + part + "': '" + s + "' is not a rank in 0.." +
                                std::to_string(n - 1));
  return static_cast<int32_t>(v);
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\n") - a + 1);
}

}  // namespace

Graph parse_neighbors(const std::string& text, int32_t n) {
  Graph g(n);
  std::vector<bool> listed(n, false);
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ';')) {
    part = trim(part);
    if (part.empty()) continue;
    const size_t colon = part.find(':');
    if (colon == std::string::npos)
      throw std::invalid_argument("'" + part + "': expected <rank>:<peer>,<peer>,...");
    const int32_t r = parse_rank(trim(part.substr(0, colon)), n, part);
    if (listed[r]) throw std::invalid_argument("rank " + std::to_string(r) + " is listed twice");
    listed[r] = true;
    std::stringstream peers(part.substr(colon + 1));
    std::string p;
    while (std::getline(peers, p, ',')) {
      if (trim(p).empty()) continue;
      const int32_t q = parse_rank(trim(p), n, part);
      if (q == r)
        throw std::invalid_argument("rank " + std::to_string(r) + " lists itself as a neighbour");
      if (std::find(g[r].begin(), g[r].end(), q) == g[r].end()) g[r].push_back(q);
    }
  }
  return g;
}

Topology::Topology(const std::string& kind, const std::string& neighbors, int32_t world_size)
    : kind_(kind), world_(world_size) {
  if (world_size < 1) throw std::invalid_argument("world size " + std::to_string(world_size));
  if (kind == "ring") {
    adjacency_ = ring(world_size);
  } else if (kind == "exponential") {
    adjacency_ = exponential(world_size);
  } else if (kind == "neighbors") {
    adjacency_ = parse_neighbors(neighbors, world_size);
    check_symmetric_connected(adjacency_);
  } else if (kind == "shift_one") {
    if (world_size % 2 != 0)
      throw std::invalid_argument(
          "shift_one pairs the lower and upper half of the ranks and needs "
          "an even world size, got " +
          std::to_string(world_size) + " (use ring or complete)");
  } else if (kind != "complete") {
    throw std::invalid_argument("unknown topology '" + kind + "'");
  }
  for (auto& peers : adjacency_) std::sort(peers.begin(), peers.end());
}

int32_t Topology::shift_one_peer(int32_t rank, int64_t round, int32_t n) {
  const int64_t half = n / 2;
  if (rank < half) return static_cast<int32_t>(half + (round + rank) % half);
  return static_cast<int32_t>((((rank - half - round) % half) + half) % half);
}

MixingRow Topology::row(int32_t rank, int64_t round) const {
  MixingRow out;
  if (world_ == 1) return out;
  if (kind_ == "complete") {
    out.average_all = true;
    out.self_weight = 1.0 / world_;
    return out;
  }
  if (kind_ == "shift_one") {
    out.self_weight = 0.5;
    out.links.push_back({shift_one_peer(rank, round, world_), 0.5});
    return out;
  }
  const auto deg = [&](int32_t r) { return static_cast<double>(adjacency_[r].size()); };
  for (int32_t q : adjacency_[rank]) {
    const double w = 1.0 / (1.0 + std::max(deg(rank), deg(q)));
    out.links.push_back({q, w});
    out.self_weight -= w;
  }
  return out;
}

}  // namespace distopt::plugins::decentralized
