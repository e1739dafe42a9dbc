// The `torch.distributed` backend named "distopt": a c10d process group
// (c10d::ProcessGroup on PyTorch 1.x, c10d::Backend on 2.x) whose
// collectives and point-to-point operations run on a distopt communicator
// plugin. `import distopt` registers it (distopt/__init__.py), so that
// `dist.init_process_group("distopt", ...)` needs no other change.
#pragma once

#include <torch/version.h>

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace distopt::python {

#if TORCH_VERSION_MAJOR >= 2
using C10dBase = c10d::Backend;  // 2.x: ProcessGroup dispatches to per-device backends
#else
using C10dBase = c10d::ProcessGroup;
#endif

/// What the process groups this process creates run on (set from Python by
/// distopt.set_backend_options, or from the environment; see __init__.py).
struct BackendOptions {
  /// Communicator plugin for CPU tensors, and its options as YAML or JSON
  /// map text ("" or "{}": its defaults).
  std::string communicator = "tcp";
  std::string options;
  /// Communicator plugin for CUDA tensors (created at the first CUDA
  /// operation of a group, collectively), and its options.
  std::string cuda_communicator = "nccl";
  std::string cuda_options;
  /// Extra plugin directories searched before the default ones
  /// (PluginRegistry::search_path).
  std::vector<std::string> plugin_paths;
  /// A collective still waiting after this many seconds makes the ranks
  /// compare what they wait on (world.collective_check_s); 0: off.
  double collective_check_s = 1.0;
};

/// Create one rank's process group over `store` (torch's PrefixStore for the
/// group): `rank` of `world_size`, operations failing after `timeout` unless
/// an operation's options give their own. Collective across the group's
/// ranks. Throws distopt::Error (PluginError for an unknown communicator,
/// ConfigError naming the option, CommError / RendezvousError naming the
/// peer) when the communicator cannot be created.
///
/// Every operation of PyTorch's API is supported on CPU tensors (and on CUDA
/// tensors through `cuda_communicator`): broadcast, allreduce (SUM, AVG, MIN,
/// MAX natively for float32/64, float16, bfloat16, int32, int64; PRODUCT,
/// BAND, BOR, BXOR and other dtypes through an allgather and a local
/// reduction; PREMUL_SUM), allreduce_coalesced, reduce, allgather,
/// _allgather_base, allgather_coalesced, gather, scatter, reduce_scatter,
/// _reduce_scatter_base, alltoall, alltoall_base, send, recv, barrier, except
/// recvAnysource (refused). Operations are issued on the calling thread, in
/// call order, and complete on the group's completion thread, which marks
/// each Work and its getFuture() (DDP's communication hooks) done. Work::wait
/// raises the communicator's error (naming the peer) or a timeout.
c10::intrusive_ptr<C10dBase> make_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int world_size,
                                                std::chrono::milliseconds timeout,
                                                const BackendOptions& options);

/// Wait, at most `limit`, until the Future completions of every process group
/// of this process have run (call without the GIL, before the interpreter
/// finalizes: distopt/__init__.py does at exit).
void drain_callbacks(std::chrono::milliseconds limit);

}  // namespace distopt::python
