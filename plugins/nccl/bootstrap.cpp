#include "bootstrap.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "distopt/sdk/base/host.hpp"

namespace distopt::plugins::nccl {
namespace {

constexpr char kFailureMark = '!';  // a value starting with it carries rank 0's failure

std::string id_key(const dopt_create_args& args) {
  return std::string(args.scope ? args.scope : "nccl") + "/nccl/unique_id";
}

/// Short sleeps first: a settled call normally takes microseconds.
void backoff(int& round) {
  if (round < 50) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(round < 500 ? 100 : 1000));
  }
  ++round;
}

}  // namespace

ncclConfig_t nonblocking_config() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

void publish_failure(const dopt_create_args& args, const std::string& reason) noexcept {
  if (args.rank != 0 || args.world_size < 2 || !args.store || !sdk::host()) return;
  try {
    const std::string key = id_key(args);
    std::string value = kFailureMark + reason;
    if (value.size() == sizeof(ncclUniqueId)) value += ' ';  // never the size of an id
    sdk::host()->store_set(args.store, key.c_str(), value.data(), value.size());
  } catch (...) {
  }
}

ncclUniqueId exchange_unique_id(const Api& a, const dopt_create_args& args, const Settings& s) {
  const dopt_host_api* h = sdk::host();
  const std::string key = id_key(args);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (args.rank == 0) {
    ncclResult_t r = a.ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw sdk::Error(DOPT_ERR_COMM, "ncclGetUniqueId failed: " + nccl_error(a, r));
    const std::string value(reinterpret_cast<const char*>(&id), sizeof id);
    if (args.world_size > 1 && h->store_set(args.store, key.c_str(), value.data(), value.size()))
      throw sdk::Error(DOPT_ERR_COMM,
                       "could not publish the ncclUniqueId in the store (key " + key + ")");
    return id;
  }
  char buf[sizeof(ncclUniqueId) + 512];
  size_t len = 0;
  const int64_t ms = s.timeout().count();
  dopt_status st = h->store_get(args.store, key.c_str(), buf, sizeof buf, &len, ms);
  if (st == DOPT_ERR_TIMEOUT)
    throw sdk::Error(DOPT_ERR_TIMEOUT, "rank 0 did not publish the ncclUniqueId (store key " + key +
                                           ") within timeout_s = " + std::to_string(s.timeout_s) +
                                           " s");
  if (st != DOPT_OK)
    throw sdk::Error(DOPT_ERR_COMM, "could not read the ncclUniqueId from the store (key " + key +
                                        "): " + dopt_status_string(st));
  len = std::min(len, sizeof buf);
  if (len != sizeof id && len > 0 && buf[0] == kFailureMark)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "rank 0 could not create its endpoint: " + std::string(buf + 1, len - 1));
  if (len != sizeof id)
    throw sdk::Error(DOPT_ERR_COMM, "the ncclUniqueId in the store has " + std::to_string(len) +
                                        " bytes, not " + std::to_string(sizeof id));
  std::memcpy(&id, buf, sizeof id);
  return id;
}

void settle(const Api& a, ncclComm_t comm, Clock::time_point deadline, const std::string& what,
            const std::atomic<bool>* aborted) {
  for (int round = 0;; backoff(round)) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = a.ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess)
      throw sdk::Error(DOPT_ERR_COMM, what + ": ncclCommGetAsyncError failed: " + nccl_error(a, r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      throw sdk::Error(DOPT_ERR_COMM, what + " failed: " + nccl_error(a, state, comm));
    if (aborted && aborted->load())
      throw sdk::Error(DOPT_ERR_ABORTED, what + ": the communicator was aborted");
    if (Clock::now() > deadline)
      throw sdk::Error(DOPT_ERR_TIMEOUT, what + " did not complete within timeout_s");
  }
}

ncclComm_t init_comm(const Api& a, const ncclUniqueId& id, int world, int rank, const Settings& s) {
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  ncclResult_t r = a.ncclCommInitRankConfig(&comm, world, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) a.ncclCommAbort(comm);
    throw sdk::Error(DOPT_ERR_COMM, "ncclCommInitRankConfig failed: " + nccl_error(a, r));
  }
  try {
    settle(a, comm, Clock::now() + s.timeout(),
           "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " + std::to_string(world) +
               ")");
  } catch (...) {
    a.ncclCommAbort(comm);
    throw;
  }
  return comm;
}

}  // namespace distopt::plugins::nccl
