// The Api table of api.hpp: dlopen-based loading of NCCL and the CUDA runtime.
#include "api.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "distopt/sdk/base/host.hpp"

namespace distopt::plugins::nccl {
namespace {

/// dlopen the first of `names` that loads; RTLD_NOLOAD first, so that a copy
/// the process already has (PyTorch's) is the one used. `why` collects each
/// failure.
void* open_first(const std::vector<std::string>& names, std::string& chosen, std::string& why) {
  for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const auto& n : names) {
      dlerror();
      if (void* h = dlopen(n.c_str(), flags)) {
        chosen = n;
        return h;
      }
      if (!(flags & RTLD_NOLOAD)) {
        const char* e = dlerror();
        why += "\n  " + n + ": " + (e ? e : "not found");
      }
    }
  }
  return nullptr;
}

std::vector<std::string> candidates(const char* env_var, const std::vector<std::string>& sonames) {
  if (const char* e = std::getenv(env_var); e && *e) return {e};
  std::vector<std::string> out = sonames;
  std::vector<std::string> roots;
  if (const char* h = std::getenv("CUDA_HOME"); h && *h) roots.push_back(h);
  roots.push_back("/usr/local/cuda");
  for (const auto& r : roots)
    for (const char* sub : {"/lib64/", "/lib/"})
      for (const auto& s : sonames) out.push_back(r + sub + s);
  return out;
}

template <class F>
void bind(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
}

#define DISTOPT_BIND(LIB, FIELD) bind(LIB, #FIELD, a.FIELD, missing)

void bind_cudart(void* h, Api& a, std::string& missing) {
  DISTOPT_BIND(h, cudaGetDeviceCount);
  DISTOPT_BIND(h, cudaSetDevice);
  DISTOPT_BIND(h, cudaMalloc);
  DISTOPT_BIND(h, cudaFree);
  DISTOPT_BIND(h, cudaStreamCreateWithFlags);
  DISTOPT_BIND(h, cudaStreamDestroy);
  DISTOPT_BIND(h, cudaStreamWaitEvent);
  DISTOPT_BIND(h, cudaEventCreateWithFlags);
  DISTOPT_BIND(h, cudaEventDestroy);
  DISTOPT_BIND(h, cudaEventRecord);
  DISTOPT_BIND(h, cudaEventQuery);
  DISTOPT_BIND(h, cudaGetErrorName);
  DISTOPT_BIND(h, cudaGetErrorString);
}

void bind_nccl(void* h, Api& a, std::string& missing) {
  DISTOPT_BIND(h, ncclGetVersion);
  DISTOPT_BIND(h, ncclGetUniqueId);
  DISTOPT_BIND(h, ncclCommInitRankConfig);
  DISTOPT_BIND(h, ncclCommSplit);
  DISTOPT_BIND(h, ncclCommGetAsyncError);
  DISTOPT_BIND(h, ncclCommCount);
  DISTOPT_BIND(h, ncclCommUserRank);
  DISTOPT_BIND(h, ncclCommFinalize);
  DISTOPT_BIND(h, ncclCommDestroy);
  DISTOPT_BIND(h, ncclCommAbort);
  DISTOPT_BIND(h, ncclGetErrorString);
  DISTOPT_BIND(h, ncclGetLastError);
  DISTOPT_BIND(h, ncclAllReduce);
  DISTOPT_BIND(h, ncclReduceScatter);
  DISTOPT_BIND(h, ncclAllGather);
  DISTOPT_BIND(h, ncclBroadcast);
  DISTOPT_BIND(h, ncclSend);
  DISTOPT_BIND(h, ncclRecv);
  DISTOPT_BIND(h, ncclGroupStart);
  DISTOPT_BIND(h, ncclGroupEnd);
}
#undef DISTOPT_BIND

Api load() {
  Api a{};
  std::string why;
  void* cudart = open_first(
      candidates("DISTOPT_CUDART_LIBRARY",
                 {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}),
      a.cudart_path, why);
  if (!cudart)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "the CUDA runtime library could not be loaded (set DISTOPT_CUDART_LIBRARY "
                     "to its path); tried:" +
                         why);
  void* nccl = open_first(candidates("DISTOPT_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"}),
                          a.nccl_path, why);
  if (!nccl)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "the NCCL library could not be loaded (set DISTOPT_NCCL_LIBRARY to its "
                     "path, e.g. the libnccl.so.2 of a PyTorch installation); tried:" +
                         why);
  std::string missing;
  bind_cudart(cudart, a, missing);
  if (!missing.empty())
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     a.cudart_path + " lacks the CUDA runtime function(s) " + missing);
  bind_nccl(nccl, a, missing);
  if (!missing.empty())
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, a.nccl_path + " lacks the NCCL function(s) " + missing +
                                               " (NCCL 2.18 or newer is needed)");
  if (a.ncclGetVersion(&a.nccl_version) != ncclSuccess) a.nccl_version = 0;
  return a;
}

}  // namespace

const Api& api() {
  static std::once_flag once;
  static Api table;
  static std::string failure;
  std::call_once(once, [] {
    try {
      table = load();
    } catch (const sdk::Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw sdk::Error(DOPT_ERR_UNSUPPORTED, failure);
  return table;
}

std::string cuda_error(const Api& a, cudaError_t e) {
  const char* name = a.cudaGetErrorName ? a.cudaGetErrorName(e) : nullptr;
  const char* text = a.cudaGetErrorString ? a.cudaGetErrorString(e) : nullptr;
  return std::string(name ? name : ("cudaError " + std::to_string(static_cast<int>(e))).c_str()) +
         (text ? std::string(" (") + text + ")" : "");
}

std::string nccl_error(const Api& a, ncclResult_t r, ncclComm_t comm) {
  std::string s = a.ncclGetErrorString ? a.ncclGetErrorString(r) : "";
  std::string out =
      "ncclResult " + std::to_string(static_cast<int>(r)) + (s.empty() ? "" : " (" + s + ")");
  const char* last = a.ncclGetLastError ? a.ncclGetLastError(comm) : nullptr;
  if (last && *last) out += ": " + std::string(last);
  return out;
}

}  // namespace distopt::plugins::nccl
