// tcp:// rendezvous store: rank 0 (or, elastic, the launcher: StoreServer)
// hosts a small key-value server on background threads; every rank (rank 0
// too) talks to it as a client.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "distopt/store.hpp"

namespace distopt::store {

/// The server: one thread accepting, one thread per client connection (a
/// job has few ranks). A client's first frame must carry the job token, or
/// the connection is refused and the refusal logged.
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, std::string token);
  ~TcpStoreServer();
  int port() const { return port_; }
  /// Blocks until no client is connected or `bound` has passed; returns how
  /// many clients are still connected. Thread-safe.
  int linger(std::chrono::milliseconds bound);

 private:
  void accept_loop();
  void serve(int fd);
  std::vector<uint8_t> handle(const std::vector<uint8_t>& req, bool* close_conn);

  std::string token_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};  // pipe that stops the accept loop
  std::atomic<bool> stop_{false};
  std::thread acceptor_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::vector<std::thread> workers_;
  std::vector<int> client_fds_;  // -1 once that client's worker has ended
  int live_ = 0;                 // clients whose worker has not ended
  std::condition_variable gone_cv_;
};

/// How long the hosting rank's store outlives its own client while other
/// ranks are still connected (see ~TcpStore).
constexpr std::chrono::milliseconds kServerLinger{5000};

/// A client connection (thread-safe: one request at a time under a mutex).
class TcpStore : public Store {
 public:
  /// Connects to host:port, retrying until `timeout`; rank 0 also starts the
  /// server unless `opts.serve` is false.
  TcpStore(const std::string& host, int port, const StoreOptions& opts);
  /// On the hosting rank, keeps serving until every other rank has
  /// disconnected or kServerLinger has passed.
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  using Store::set;

 private:
  std::vector<uint8_t> call(const std::vector<uint8_t>& req, std::chrono::milliseconds wait,
                            const std::string& what);

  std::unique_ptr<TcpStoreServer> server_;
  std::string where_;  // host:port, for messages
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  int fd_ = -1;
  // The request that failed and closed the connection, so that every later
  // request's error says why (a cut network times out once, then each
  // request would only say "closed").
  std::string closed_by_;
};

}  // namespace distopt::store
