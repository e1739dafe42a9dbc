#include "optim/bucket_plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

namespace distopt::optim {
namespace {

size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

struct Open {
  PlannedBucket bucket;
  size_t first_pos = 0;  // position of its first entry in reverse order
  size_t bytes = 0;      // aligned end of the last entry
};

}  // namespace

std::vector<PlannedBucket> plan_buckets(const std::vector<PlanInput>& params, double cap_bytes,
                                        size_t align_bytes) {
  if (align_bytes < 1) throw std::invalid_argument("align_bytes must be >= 1");
  std::vector<std::pair<size_t, PlannedBucket>> closed;  // (first_pos, bucket)
  std::map<std::pair<int, int>, Open> open;              // by (dtype, unit)
  auto close = [&](Open& o) {
    o.bucket.length =
        round_up(o.bytes, std::lcm(align_bytes, o.bucket.element_size)) / o.bucket.element_size;
    closed.emplace_back(o.first_pos, std::move(o.bucket));
  };

  size_t pos = 0;
  for (size_t k = params.size(); k-- > 0; ++pos) {
    const PlanInput& in = params[k];
    if (in.element_size == 0) throw std::invalid_argument("element_size must be > 0");
    size_t align = std::lcm(align_bytes, in.element_size);
    const std::pair<int, int> key{in.dtype, in.unit};
    auto it = open.find(key);
    if (it != open.end() && in.element_size != it->second.bucket.element_size)
      throw std::invalid_argument("one dtype code with two element sizes");
    size_t entry_bytes = in.numel * in.element_size;
    if (it != open.end()) {
      size_t start = round_up(it->second.bytes, align);
      if (in.unit < 0 && static_cast<double>(start + entry_bytes) > cap_bytes) {
        close(it->second);
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      Open o;
      o.bucket.dtype = in.dtype;
      o.bucket.unit = in.unit;
      o.bucket.element_size = in.element_size;
      o.first_pos = pos;
      it = open.emplace(key, std::move(o)).first;
    }
    Open& o = it->second;
    size_t start = round_up(o.bytes, align);
    o.bucket.entries.push_back({k, start / in.element_size, in.numel});
    o.bytes = start + entry_bytes;
  }
  for (auto& kv : open) close(kv.second);
  std::stable_sort(closed.begin(), closed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<PlannedBucket> out;
  out.reserve(closed.size());
  for (auto& c : closed) out.push_back(std::move(c.second));
  return out;
}

}  // namespace distopt::optim
