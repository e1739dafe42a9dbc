// A test-only communicator, `store_p2p`: the SDK's p2p shell
// (sdk/collective/p2p_communicator.hpp) over a transport that carries each tagged
// message as one key of the job's rendezvous store. It proves that a
// communicator over a new transport is the transport plus a few lines: it
// runs the communicator conformance suite (tests/p2p/CMakeLists.txt), with
// shm on (collectives over the SDK's shared memory, barrier over the store)
// and off (everything over the store). Slow and never freed (the store has
// no delete): for tests only, never installed.
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "distopt/sdk/collective/p2p_communicator.hpp"

namespace {

using namespace distopt::sdk;
using namespace distopt::sdk::p2p;

/// Message k (k-th with this tag) from rank s to rank d with tag t is the
/// store key "<prefix>/m/s/d/t/k": posting order on both sides matches
/// them, as Transport requires. isend is a store_set (never blocks on the
/// peer); a receive polls (test) or waits (wait_all) for its key.
class StoreTransport final : public Transport {
 public:
  StoreTransport(dopt_store* store, std::string prefix, int rank, int world)
      : store_(store), prefix_(std::move(prefix)), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Handle isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    const std::string k = key(rank_, peer, tag, sent_[{peer, tag}]++);
    if (host()->store_set(store_, k.c_str(), data, bytes) != DOPT_OK)
      throw Error(DOPT_ERR_COMM, "rank " + std::to_string(peer) + ": store refused '" + k + "'");
    ops_[++next_] = Op{peer, "", nullptr, 0};  // complete: the store holds it
    return next_;
  }
  Handle irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    ops_[++next_] = Op{peer, key(peer, rank_, tag, received_[{peer, tag}]++), data, bytes};
    return next_;
  }
  bool test(Handle h) override {
    if (!get(ops_.at(h), 0)) return false;
    ops_.erase(h);
    return true;
  }
  void wait_all(const Handle* hs, size_t n, Clock::time_point deadline) override {
    std::map<Handle, Op> mine;  // released also when a receive throws
    for (size_t i = 0; i < n; ++i) mine.emplace(hs[i], ops_.at(hs[i])), ops_.erase(hs[i]);
    for (auto& [h, op] : mine) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (!get(op, std::max<int64_t>(1, left.count())))
        throw Error(DOPT_ERR_TIMEOUT, "timed out waiting for rank " + std::to_string(op.peer));
    }
  }

 private:
  struct Op {
    int peer;
    std::string key;  ///< "": a send
    void* data;
    size_t bytes;
  };
  std::string key(int src, int dst, uint64_t tag, uint64_t k) const {
    return prefix_ + "/m/" + std::to_string(src) + "/" + std::to_string(dst) + "/" +
           std::to_string(tag) + "/" + std::to_string(k);
  }
  /// Fetch a receive's message, waiting up to timeout_ms; false if absent.
  bool get(const Op& op, int64_t timeout_ms) {
    if (op.key.empty()) return true;
    size_t len = 0;
    const dopt_status st =
        host()->store_get(store_, op.key.c_str(), op.data, op.bytes, &len, timeout_ms);
    if (st == DOPT_ERR_TIMEOUT) return false;
    if (st != DOPT_OK)
      throw Error(DOPT_ERR_COMM, "rank " + std::to_string(op.peer) + ": store get of '" + op.key +
                                     "' failed (" + std::to_string(st) + ")");
    if (len != op.bytes)
      throw Error(DOPT_ERR_INTERNAL, "rank " + std::to_string(op.peer) + " sent " +
                                         std::to_string(len) + " bytes, expected " +
                                         std::to_string(op.bytes));
    return true;
  }
  dopt_store* store_;
  std::string prefix_;
  int rank_, world_;
  Handle next_ = 0;
  std::map<Handle, Op> ops_;
  std::map<std::pair<int, uint64_t>, uint64_t> sent_, received_;  ///< (peer, tag) -> messages
};

// ---- the communicator: the transport plus these lines -----------------------

struct Config : ShellConfig {
  void read_own(const OptionsView&) {}  // no options of its own
};

ShellSetup store_setup() {
  ShellSetup s;
  s.component = s.default_scope = "store_p2p";
  s.fallback = "the store";
  return s;
}

class StoreComm final : public P2PCommunicator {
 public:
  explicit StoreComm(const dopt_create_args& a) : StoreComm(a, config_of<Config>(a)) {}
  ~StoreComm() override { shutdown(); }

 private:
  StoreComm(const dopt_create_args& a, const Config& c)
      : P2PCommunicator(a, c, store_setup()), cfg_(c), t_(a.store, prefix(), rank(), world_size()) {
    start(t_, CollectiveOptions{});
  }
  std::unique_ptr<Communicator> split_child(const dopt_create_args& a) override {
    return std::unique_ptr<Communicator>(new StoreComm(a, cfg_));
  }
  Config cfg_;
  StoreTransport t_;
};

// Without shm_stores_option(), as components written before it: the shell
// must read that schema too (shm_stores then defaults to auto).
constexpr dopt_option_spec kOptions[] = {timeout_option(), shm_option(), shm_bytes_option()};

}  // namespace

DOPT_PLUGIN("store_p2p", "1.0.0",
            DOPT_COMPONENT(StoreComm, "store_p2p", "1.0.0",
                           "test only: the SDK's p2p shell over the rendezvous store", kOptions))
