// What elastic/ may see and change of a Runtime (elastic_link.hpp).
#include "runtime/elastic_link.hpp"

#include <utility>

#include "distopt/elastic_membership.hpp"
#include "runtime/runtime_impl.hpp"

namespace distopt::runtime {

ElasticLink::ElasticLink(Runtime& rt) : m_(*rt.impl_) {}

const JobConfig& ElasticLink::config() const { return m_.cfg; }
const ProcessInfo& ElasticLink::process() const { return m_.proc; }
Store& ElasticLink::store() const { return *m_.store; }
Communicator& ElasticLink::communicator() const { return *m_.comm; }
Communicator& ElasticLink::control_communicator() const { return m_.control_comm(); }
int64_t ElasticLink::member() const { return m_.member; }
int64_t ElasticLink::generation() const { return m_.generation; }
const std::vector<int64_t>& ElasticLink::members() const { return m_.members; }
int ElasticLink::initial_world_size() const { return m_.initial_world_size; }
bool ElasticLink::joining() const { return m_.joining; }
const Decision& ElasticLink::joined_by() const { return m_.joined_by; }
void ElasticLink::joined() { m_.joining = false; }

void ElasticLink::enter(int64_t generation, const std::vector<int64_t>& members) {
  m_.generation = generation;
  m_.members = members;
}

void ElasticLink::disconnect() { m_.disconnect(); }

void ElasticLink::reconnect(const ProcessInfo& proc, int64_t generation) {
  m_.reconnect(proc, membership::generation_prefix(generation));
}

void ElasticLink::keep_until_disconnect(std::shared_ptr<void> buffers) {
  m_.keep_until_disconnect.push_back(std::move(buffers));
}

}  // namespace distopt::runtime
