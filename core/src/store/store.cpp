// make_store (URL dispatch) and Store::barrier.
#include "distopt/store.hpp"

#include <cstdlib>

#include "distopt/error.hpp"
#include "store/file_store.hpp"
#include "store/net.hpp"
#include "store/tcp_store.hpp"

namespace distopt {

void Store::barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout) {
  // Reusable: the n-th arrival belongs to generation (n-1)/world_size, and the
  // last arrival of a generation releases it.
  const std::string base = "distopt/barrier/" + name;
  int64_t n = add(base + "/count", 1);
  int64_t gen = (n - 1) / world_size;
  std::string done = base + "/done/" + std::to_string(gen);
  if (n % world_size == 0) set(done, std::string("1"));
  try {
    get(done, timeout);
  } catch (const RendezvousError&) {
    int64_t arrived = add(base + "/count", 0) - gen * world_size;
    throw RendezvousError("barrier '" + name + "': only " +
                          std::to_string(std::min<int64_t>(arrived, world_size)) + " of " +
                          std::to_string(world_size) + " ranks arrived within " +
                          std::to_string(timeout.count()) + " ms");
  }
}

namespace {

// DISTOPT_STORE_SERVED=1: the launcher serves the store (`distopt launch
// --elastic`), so rank 0 must not try to bind the same port.
bool served_elsewhere() {
  const char* v = std::getenv("DISTOPT_STORE_SERVED");
  return v && std::string(v) == "1";
}

}  // namespace

struct StoreServer::Impl {
  store::TcpStoreServer server;
  Impl(const std::string& host, int port, const std::string& token) : server(host, port, token) {}
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;

std::unique_ptr<StoreServer> StoreServer::start(const std::string& host, int port,
                                                const std::string& token) {
  return std::unique_ptr<StoreServer>(new StoreServer(std::make_unique<Impl>(host, port, token)));
}

int StoreServer::port() const { return impl_->server.port(); }

std::shared_ptr<Store> make_store(const StoreOptions& options) {
  StoreOptions opts = options;
  if (served_elsewhere()) opts.serve = false;
  const std::string& url = opts.url;
  auto starts = [&](const char* p) { return url.rfind(p, 0) == 0; };
  if (opts.world_size < 1 || opts.rank < 0 || opts.rank >= opts.world_size)
    throw ConfigError("rendezvous: rank " + std::to_string(opts.rank) + " is not in [0, " +
                      std::to_string(opts.world_size) + ")");
  if (starts("tcp://")) {
    std::string host;
    int port = 0;
    store::split_host_port(url.substr(6), host, port);
    if (port == 0 && (opts.world_size > 1 || !opts.serve))
      throw ConfigError("rendezvous '" + url + "': port 0 only works for a single process" +
                        (opts.serve ? "" : " that serves the store itself"));
    return std::make_shared<store::TcpStore>(host, port, opts);
  }
  if (starts("env://")) {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (!addr || !*addr || !port || !*port)
      throw ConfigError("rendezvous 'env://' needs MASTER_ADDR and MASTER_PORT in the environment");
    StoreOptions o = opts;
    o.url = std::string("tcp://") + addr + ":" + port;
    return make_store(o);
  }
  if (starts("file://")) return std::make_shared<store::FileStore>(url.substr(7), opts.timeout);
  throw ConfigError("rendezvous URL '" + url + "' is not tcp://HOST:PORT, env:// or file://PATH");
}

}  // namespace distopt
