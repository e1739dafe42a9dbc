#include "node_layout.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "distopt/sdk/base/fnv1a.hpp"

namespace distopt::plugins::hierarchical {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

}  // namespace

std::string node_name(int32_t rank, int32_t world_size, const char* env) {
  if (env) {
    const std::string v = env;
    std::string name = trim(v);
    if (v.find(',') != std::string::npos) {
      const std::vector<std::string> names = split_commas(v);
      if (static_cast<int64_t>(names.size()) != world_size)
        throw std::invalid_argument("DISTOPT_NODE_ID='" + v + "' lists " +
                                    std::to_string(names.size()) + " node names for " +
                                    std::to_string(world_size) +
                                    " ranks (give one per rank, or this rank's alone)");
      name = trim(names[static_cast<size_t>(rank)]);
    }
    if (name.empty())
      throw std::invalid_argument("DISTOPT_NODE_ID='" + v + "' gives rank " + std::to_string(rank) +
                                  " an empty node name");
    return name;
  }
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
    throw std::invalid_argument("cannot read the host name; set DISTOPT_NODE_ID");
  return host;
}

int64_t node_key(const std::string& name) { return sdk::Fnv1a().chars(name).digest_i64(); }

int32_t NodeLayout::max_local_size() const {
  return node_size.empty() ? 0 : *std::max_element(node_size.begin(), node_size.end());
}

std::string NodeLayout::describe() const {
  std::string sizes;
  for (size_t n = 0; n < node_size.size(); ++n)
    sizes += (n ? "+" : "") + std::to_string(node_size[n]);
  return std::to_string(num_nodes()) + (num_nodes() == 1 ? " node of " : " nodes of ") + sizes +
         " ranks";
}

NodeLayout make_layout(const std::vector<int64_t>& keys, int32_t rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= keys.size())
    throw std::invalid_argument("rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(keys.size()) + ")");
  NodeLayout l;
  l.rank = rank;
  std::map<int64_t, int32_t> index;  // key -> node, in order of first appearance
  for (int64_t k : keys) {
    auto [it, fresh] = index.emplace(k, static_cast<int32_t>(l.node_size.size()));
    if (fresh) {
      l.node_size.push_back(0);
      l.members.emplace_back();
    }
    const int32_t n = it->second;
    l.node_of.push_back(n);
    l.local_of.push_back(l.node_size[n]++);
    l.members[n].push_back(static_cast<int32_t>(l.node_of.size() - 1));
  }
  return l;
}

PiecePlan::PiecePlan(size_t n, int32_t max_local_size, int32_t l)
    : numel(n),
      pieces(static_cast<size_t>(std::max(max_local_size, 1))),
      local_size(std::max(l, 1)) {
  piece = (numel + pieces - 1) / pieces;
  slots = (pieces + static_cast<size_t>(local_size) - 1) / static_cast<size_t>(local_size);
}

int64_t PiecePlan::piece_at(int32_t j, size_t slot) const {
  const size_t k = static_cast<size_t>(j) + slot * static_cast<size_t>(local_size);
  return k < pieces ? static_cast<int64_t>(k) : -1;
}

size_t PiecePlan::first(size_t k) const { return std::min(numel, k * piece); }
size_t PiecePlan::last(size_t k) const { return std::min(numel, (k + 1) * piece); }

}  // namespace distopt::plugins::hierarchical
