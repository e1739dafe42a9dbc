// The NCCL and CUDA runtime functions the `nccl` plugin uses, as a table of
// function pointers filled by dlopen/dlsym at create time: the plugin links
// neither library, so it loads (and `distopt plugins` lists it) on every host.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace distopt::plugins::nccl {

/// Function pointers into one libnccl and one libcudart (never unloaded: NCCL
/// keeps threads). Field names are the C names without their prefix.
struct Api {
  // CUDA runtime
  cudaError_t (*cudaGetDeviceCount)(int*);
  cudaError_t (*cudaSetDevice)(int);
  cudaError_t (*cudaMalloc)(void**, size_t);
  cudaError_t (*cudaFree)(void*);
  cudaError_t (*cudaStreamCreateWithFlags)(cudaStream_t*, unsigned int);
  cudaError_t (*cudaStreamDestroy)(cudaStream_t);
  cudaError_t (*cudaStreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned int);
  cudaError_t (*cudaEventCreateWithFlags)(cudaEvent_t*, unsigned int);
  cudaError_t (*cudaEventDestroy)(cudaEvent_t);
  cudaError_t (*cudaEventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*cudaEventQuery)(cudaEvent_t);
  const char* (*cudaGetErrorName)(cudaError_t);
  const char* (*cudaGetErrorString)(cudaError_t);
  // NCCL
  ncclResult_t (*ncclGetVersion)(int*);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId*);
  ncclResult_t (*ncclCommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*ncclCommSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*ncclCommCount)(const ncclComm_t, int*);
  ncclResult_t (*ncclCommUserRank)(const ncclComm_t, int*);
  ncclResult_t (*ncclCommFinalize)(ncclComm_t);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t);
  ncclResult_t (*ncclCommAbort)(ncclComm_t);
  const char* (*ncclGetErrorString)(ncclResult_t);
  const char* (*ncclGetLastError)(ncclComm_t);
  ncclResult_t (*ncclAllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t);
  ncclResult_t (*ncclReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                    ncclComm_t, cudaStream_t);
  ncclResult_t (*ncclAllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                cudaStream_t);
  ncclResult_t (*ncclBroadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                cudaStream_t);
  ncclResult_t (*ncclSend)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*ncclRecv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*ncclGroupStart)();
  ncclResult_t (*ncclGroupEnd)();

  std::string nccl_path;    ///< the file that provided NCCL (as dlopen was given it)
  std::string cudart_path;  ///< the file that provided the CUDA runtime
  int nccl_version = 0;     ///< ncclGetVersion, e.g. 22803
};

/// The process-wide table, loaded on first use (thread-safe). Search order,
/// each for NCCL and the CUDA runtime: $DISTOPT_NCCL_LIBRARY /
/// $DISTOPT_CUDART_LIBRARY when set (then only that file); else a copy
/// already loaded in the process (a PyTorch process's bundled NCCL); else
/// libnccl.so.2 / libcudart.so.{13,12,11.0} through the dynamic loader's path,
/// then under $CUDA_HOME and /usr/local/cuda (lib64, lib). Throws
/// sdk::Error(DOPT_ERR_UNSUPPORTED) naming each file tried and the loader's
/// reason, or the missing symbol; the failure is remembered (later calls
/// throw the same error without retrying).
const Api& api();

/// "cudaErrorNoDevice (no CUDA-capable device is detected)".
std::string cuda_error(const Api& a, cudaError_t e);
/// "ncclSystemError (unhandled system error): <ncclGetLastError>".
std::string nccl_error(const Api& a, ncclResult_t r, ncclComm_t comm = nullptr);

}  // namespace distopt::plugins::nccl
