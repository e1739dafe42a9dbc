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
  int rank = 0;     ///< rank 0 hosts the tcp:// server
  int world_size = 1;
  std::string token;  ///< job secret; the tcp server refuses clients without it
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// Create the store for `opts.url`. tcp:// and env://: rank 0 starts the
/// server in a background thread (bound to HOST), every rank connects as a
/// client presenting the token. file://: a directory shared by the ranks.
/// Throws RendezvousError / ConfigError (bad URL).
std::shared_ptr<Store> make_store(const StoreOptions& opts);

}  // namespace distopt
