// The rendezvous key-value store (c10d's Store): ranks exchange addresses,
// ids and small blobs through it before any communicator exists.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace distopt {

/// Abstract store. Every method is thread-safe. Errors: RendezvousError
/// (unreachable server, refused token, timeout naming the key).
class Store {
 public:
  virtual ~Store() = default;
  /// Set key to value, replacing an earlier value.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// Wait up to `timeout` for key, then return its value. Throws RendezvousError
  /// naming the key on timeout.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Atomically add delta to the int64 counter at key (created at 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// True if key exists now (no waiting).
  virtual bool check(const std::string& key) = 0;
  /// Default timeout for waits that do not pass one.
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Helper: string overloads.
  void set(const std::string& key, const std::string& value) {
    set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    auto v = get(key, timeout());
    return std::string(v.begin(), v.end());
  }
  /// Blocks until `world_size` ranks have called barrier(name, ...) or the
  /// timeout expires (RendezvousError naming how many arrived).
  void barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout);
};

struct StoreOptions {
  std::string url;  ///< "tcp://HOST:PORT", "env://" (MASTER_ADDR/MASTER_PORT), "file://PATH"
  int rank = 0;     ///< rank 0 hosts the tcp:// server (when `serve`)
  int world_size = 1;
  std::string token;  ///< job secret; the tcp server refuses clients without it
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// Rank 0 starts the tcp:// server (false: another process serves it, e.g.
  /// the elastic launcher, so the store outlives rank 0).
  bool serve = true;
};

/// Create the store for `opts.url`. tcp:// and env://: rank 0 starts the
/// server in a background thread (bound to HOST) unless `opts.serve` is false
/// or the environment has DISTOPT_STORE_SERVED=1 (set by `distopt launch
/// --elastic`, whose launcher serves the store); every rank connects as a
/// client presenting the token, retrying until `opts.timeout`. file://: a
/// directory shared by the ranks. Throws RendezvousError (no server within
/// the timeout, refused token, port in use) / ConfigError (bad URL, rank not
/// in [0, world_size)). On rank 0, destroying the last reference to a
/// tcp:// store it serves blocks until the other ranks have disconnected,
/// at most 5 s, so that a rank 0 which finishes or fails first does not cut
/// the others off while they read its last posts.
std::shared_ptr<Store> make_store(const StoreOptions& opts);

/// A tcp:// store server on its own: serves the protocol the clients of
/// make_store speak (`tcp://HOST:PORT` with the same token) until destroyed,
/// for a process that must outlive the ranks (the elastic launcher). Accepts
/// and answers on background threads; thread-safe. Destroying it closes every
/// client's connection (their next request throws RendezvousError).
class StoreServer {
 public:
  /// Bind `host`:`port` (an IPv4 address or name; port 0 picks a free one,
  /// see port()) and start serving clients presenting `token` (others are
  /// refused and logged). Throws RendezvousError naming host and port when
  /// the address cannot be bound (e.g. the port is in use).
  static std::unique_ptr<StoreServer> start(const std::string& host, int port,
                                            const std::string& token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  /// The port it listens on (the one picked when started with port 0).
  int port() const;

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace distopt
