// A test-only stand-in for libnccl.so.2 and libcudart.so: the subset of
// both APIs the `nccl` plugin uses, on host memory, so the plugin's logic
// (bootstrap through the store, non-blocking init, launches, requests, the
// watchdog and the abort paths) runs on machines without a GPU. The plugin
// loads it through DISTOPT_NCCL_LIBRARY / DISTOPT_CUDART_LIBRARY.
//
// Streams run work at once; an event is complete unless recorded on a
// stream that a forced hang stopped. Data moves only at world size 1 (each
// collective is then a copy); larger worlds get through init, split and
// destroy, which is what the multi-process bootstrap test needs.
//
// Environment knobs:
//   DISTOPT_STANDIN_DEVICES=N      cudaGetDeviceCount (default 1; 0 gives
//                                  cudaErrorNoDevice)
//   DISTOPT_STANDIN_LOG=FILE       append one line per init / split / abort /
//                                  finalize / destroy ("init rank=0 nranks=2
//                                  blocking=0 id=<hex>")
//   DISTOPT_STANDIN_HANG=op        the first data operation never completes
//                                  (its stream stops: later events stay
//                                  cudaErrorNotReady)
//   DISTOPT_STANDIN_HANG=init      the communicator's async state stays
//                                  ncclInProgress after init
//   DISTOPT_STANDIN_ASYNC_ERROR=1  200 ms after the first data operation the
//                                  async state becomes ncclSystemError
//   DISTOPT_STANDIN_ABORT_HANG=1   ncclCommAbort never returns
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define STANDIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

void log_line(const std::string& line) {
  const char* path = std::getenv("DISTOPT_STANDIN_LOG");
  if (!path || !*path) return;
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", line.c_str());
    std::fclose(f);
  }
}

struct Stream {
  bool stuck = false;
};
struct Event {
  bool pending = false;
};

}  // namespace

struct ncclComm {
  int rank = 0, nranks = 1;
  int polls_left = 0;  // ncclInProgress answers before ncclSuccess
  bool hang_init = false;
  bool async_error = false;
  std::chrono::steady_clock::time_point async_error_at{};
  bool ops_started = false;
};

namespace {

std::mutex g_mu;
std::string g_last_error;
int g_group_depth = 0;
struct P2p {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  ncclComm_t comm;
};
std::vector<P2p> g_group;

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

/// Common start of a data operation: world-size check and the hang knobs.
ncclResult_t start_op(ncclComm_t comm, cudaStream_t stream) {
  if (!comm) return ncclInvalidArgument;
  if (comm->nranks != 1) {
    g_last_error = "stand-in: data operations need world size 1";
    return ncclInvalidUsage;
  }
  if (!comm->ops_started) {
    comm->ops_started = true;
    if (env_is("DISTOPT_STANDIN_HANG", "op") && stream)
      reinterpret_cast<Stream*>(stream)->stuck = true;
    if (env_is("DISTOPT_STANDIN_ASYNC_ERROR", "1")) {
      comm->async_error = true;
      comm->async_error_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    }
  }
  return ncclSuccess;
}

void copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memmove(dst, src, bytes);
}

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<const unsigned char*>(p)[i];
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

ncclComm_t new_comm(int rank, int nranks, const ncclConfig_t* config) {
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  const bool nonblocking = config && config->blocking == 0;
  c->polls_left = nonblocking ? 3 : 0;
  c->hang_init = nonblocking && env_is("DISTOPT_STANDIN_HANG", "init");
  return c;
}

}  // namespace

// ---------------------------------------------------------------- CUDA runtime
STANDIN_EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  const char* v = std::getenv("DISTOPT_STANDIN_DEVICES");
  *count = v ? std::atoi(v) : 1;
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}
STANDIN_EXPORT cudaError_t cudaSetDevice(int) { return cudaSuccess; }
STANDIN_EXPORT cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::calloc(1, n ? n : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
STANDIN_EXPORT cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new Stream);
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<Stream*>(s);
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Event*>(e);
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::mutex> lk(g_mu);
  reinterpret_cast<Event*>(e)->pending = s && reinterpret_cast<Stream*>(s)->stuck;
  return cudaSuccess;
}
STANDIN_EXPORT cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(g_mu);
  return reinterpret_cast<Event*>(e)->pending ? cudaErrorNotReady : cudaSuccess;
}
STANDIN_EXPORT const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaErrorNoDevice ? "cudaErrorNoDevice" : "cudaErrorStandin";
}
STANDIN_EXPORT const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaErrorNoDevice ? "no CUDA-capable device is detected (stand-in)"
                                : "stand-in error";
}

// ---------------------------------------------------------------- NCCL
STANDIN_EXPORT ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (auto& c : id->internal) c = static_cast<char>(rd());
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                   int rank, ncclConfig_t* config) {
  if (rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *comm = new_comm(rank, nranks, config);
  log_line("init rank=" + std::to_string(rank) + " nranks=" + std::to_string(nranks) +
           " blocking=" + std::to_string(config ? config->blocking : 1) +
           " id=" + hex(id.internal, sizeof id.internal));
  return (*comm)->polls_left > 0 ? ncclInProgress : ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out,
                                          ncclConfig_t* config) {
  log_line("split rank=" + std::to_string(comm->rank) + " color=" + std::to_string(color) +
           " key=" + std::to_string(key) +
           " blocking=" + std::to_string(config ? config->blocking : 1));
  *out = color == NCCL_SPLIT_NOCOLOR ? nullptr : new_comm(0, 1, config);
  return *out && (*out)->polls_left > 0 ? ncclInProgress : ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (comm->async_error && std::chrono::steady_clock::now() >= comm->async_error_at) {
    *state = ncclSystemError;
  } else if (comm->hang_init) {
    *state = ncclInProgress;
  } else if (comm->polls_left > 0) {
    --comm->polls_left;
    *state = ncclInProgress;
  } else {
    *state = ncclSuccess;
  }
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  *n = comm->nranks;
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  *r = comm->rank;
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  log_line("finalize rank=" + std::to_string(comm->rank));
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  log_line("destroy rank=" + std::to_string(comm->rank));
  delete comm;
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  log_line("abort rank=" + std::to_string(comm ? comm->rank : -1));
  if (env_is("DISTOPT_STANDIN_ABORT_HANG", "1"))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  delete comm;
  return ncclSuccess;
}
STANDIN_EXPORT const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSystemError ? "unhandled system error (stand-in)" : "stand-in error";
}
STANDIN_EXPORT const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

STANDIN_EXPORT ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t st) {
  if (ncclResult_t e = start_op(comm, st)) return e;
  log_line("allreduce op=" + std::to_string(static_cast<int>(op)) +
           (s == r ? " inplace=1" : " inplace=0"));
  copy(r, s, n * type_size(t));
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t,
                                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t st) {
  if (ncclResult_t e = start_op(comm, st)) return e;
  log_line("reduce_scatter op=" + std::to_string(static_cast<int>(op)));
  copy(r, s, n * type_size(t));
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t,
                                          ncclComm_t comm, cudaStream_t st) {
  if (ncclResult_t e = start_op(comm, st)) return e;
  copy(r, s, n * type_size(t));
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t,
                                          int root, ncclComm_t comm, cudaStream_t st) {
  if (root < 0 || root >= comm->nranks) return ncclInvalidArgument;
  if (ncclResult_t e = start_op(comm, st)) return e;
  copy(r, s, n * type_size(t));
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclSend(const void* b, size_t n, ncclDataType_t t, int peer,
                                     ncclComm_t comm, cudaStream_t st) {
  if (g_group_depth == 0) return ncclInvalidUsage;  // self send/recv must be grouped
  if (ncclResult_t e = start_op(comm, st)) return e;
  g_group.push_back({true, const_cast<void*>(b), n * type_size(t), peer, comm});
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclRecv(void* b, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                                     cudaStream_t st) {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (ncclResult_t e = start_op(comm, st)) return e;
  g_group.push_back({false, b, n * type_size(t), peer, comm});
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
STANDIN_EXPORT ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth > 0) return ncclSuccess;
  // Self sends match self recvs in order (world size 1).
  std::vector<P2p> sends, recvs;
  for (const auto& p : g_group) (p.send ? sends : recvs).push_back(p);
  g_group.clear();
  if (sends.size() != recvs.size()) {
    g_last_error = "stand-in: unmatched send/recv in a group";
    return ncclInvalidUsage;
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].bytes != recvs[i].bytes) return ncclInvalidUsage;
    copy(recvs[i].buf, sends[i].buf, sends[i].bytes);
  }
  log_line("group sends=" + std::to_string(sends.size()) +
           " recvs=" + std::to_string(recvs.size()));
  return ncclSuccess;
}
