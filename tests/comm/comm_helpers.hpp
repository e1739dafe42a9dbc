// Helpers for communicator tests: load a communicator through the plugin
// registry (as users do) and create one rank's endpoint over a tcp:// store.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstring>
#include <memory>
#include <string>

#include "distopt/component_options.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/registry.hpp"
#include "distopt/store.hpp"
#include "multiproc.hpp"

namespace distopt::test {

/// One rank's communicator and everything it borrows (kept alive together).
struct Endpoint {
  PluginRegistry registry;
  std::shared_ptr<Store> store;
  Options options;
  std::unique_ptr<Communicator> comm;
};

inline std::string plugin_dir() {
  std::string d = env_path("DISTOPT_PLUGIN_DIR");
  return d.empty() ? "build/plugins" : d;
}

/// A port nothing on 127.0.0.1 holds right now (random_port checks it binds).
inline int free_port() { return random_port(); }

/// Collective: rendezvous on 127.0.0.1:port and create communicator `name`
/// with `options_yaml` (a YAML map as text). Throws on failure. `keep_store`,
/// when given, receives the store before the communicator is created, so it
/// outlives a failed create (rank 0 hosts it: others may still be reading).
inline std::unique_ptr<Endpoint> make_endpoint(const std::string& name, int rank, int world,
                                               int port, const std::string& options_yaml = "{}",
                                               const std::string& token = "test-token",
                                               const std::string& scope = "test",
                                               std::shared_ptr<Store>* keep_store = nullptr) {
  auto ep = std::make_unique<Endpoint>();
  ep->registry.discover({plugin_dir()});
  const ComponentInfo& info = ep->registry.get(DOPT_KIND_COMMUNICATOR, name);
  StoreOptions so;
  so.url = "tcp://127.0.0.1:" + std::to_string(port);
  so.rank = rank;
  so.world_size = world;
  so.token = token;
  so.timeout = std::chrono::seconds(60);
  ep->store = make_store(so);
  if (keep_store) *keep_store = ep->store;
  ep->options =
      Options::validate(YAML::Load(options_yaml), info.options, "<test>", "communicator.options");
  dopt_create_args a{};
  a.struct_size = sizeof a;
  a.rank = rank;
  a.world_size = world;
  a.local_rank = rank;
  a.local_world_size = world;
  a.options = ep->options.c_handle();
  a.store = reinterpret_cast<dopt_store*>(ep->store.get());
  a.scope = scope.c_str();
  a.job_token = token.c_str();
  a.bind_address = "127.0.0.1";
  ep->comm = std::make_unique<Communicator>(info, a);
  return ep;
}

inline DLDataType dl_f32() { return DLDataType{kDLFloat, 32, 1}; }

}  // namespace distopt::test
