// The elastic membership's protocol between launcher and ranks
// (distopt/elastic_membership.hpp): member ids and the store keys.
#include "distopt/elastic_membership.hpp"

namespace distopt::membership {

int64_t member_id(int rank, int restarts) {
  return static_cast<int64_t>(rank) + kRestartStride * static_cast<int64_t>(restarts);
}

int64_t joining_member_id(Store& store) { return kJoiningBase + store.add("elastic/join/ids", 1); }

bool is_joining_member(int64_t member) { return member >= kJoiningBase; }

namespace {
std::string dead_key(int64_t member) { return "elastic/dead/" + std::to_string(member); }
}  // namespace

void record_dead(Store& store, int64_t member, const std::string& how) {
  store.set(dead_key(member), how);
  store.add("elastic/dead_count", 1);
}

bool is_recorded_dead(Store& store, int64_t member) { return store.check(dead_key(member)); }

int64_t dead_count(Store& store) { return store.add("elastic/dead_count", 0); }

std::string generation_prefix(int64_t generation) {
  return "elastic/g" + std::to_string(generation);
}

std::string join_request_key(int64_t n) { return "elastic/join/" + std::to_string(n); }

}  // namespace distopt::membership
