// NcclComm: create (device choice, bootstrap) and the operations' argument
// checks; the launching is CommState's (comm_state.cpp).
#include "nccl_comm.hpp"

#include <algorithm>

#include "bootstrap.hpp"
#include "distopt/sdk/base/traffic.hpp"

namespace distopt::plugins::nccl {
namespace {

Settings settings_of(const dopt_create_args& args) {
  if (args.struct_size < DOPT_CREATE_ARGS_STRUCT_SIZE)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "create: dopt_create_args is smaller than v1.0's");
  if (args.world_size < 1 || args.rank < 0 || args.rank >= args.world_size)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "create: rank " + std::to_string(args.rank) +
                                                    " is not in [0, " +
                                                    std::to_string(args.world_size) + ")");
  if (args.world_size > 1 && !args.store)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "create: a rendezvous store is required for world_size > 1");
  return Settings::from(args.options);
}

/// The device this rank uses; UNSUPPORTED when there is none.
int pick_device(const Api& a, const Settings& s, int local_rank) {
  int count = 0;
  cudaError_t e = a.cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, "no usable CUDA device: cudaGetDeviceCount (" +
                                               a.cudart_path + ") failed with " + cuda_error(a, e));
  if (count <= 0)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "no CUDA device: cudaGetDeviceCount (" + a.cudart_path + ") found 0");
  const int device = s.device >= 0 ? static_cast<int>(s.device) : std::max(local_rank, 0) % count;
  if (device >= count)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "device " + std::to_string(device) +
                                                    " does not exist (this host has " +
                                                    std::to_string(count) + " CUDA devices)");
  e = a.cudaSetDevice(device);
  if (e != cudaSuccess)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                     "cudaSetDevice(" + std::to_string(device) + ") failed: " + cuda_error(a, e));
  return device;
}

std::shared_ptr<CommState> make_core(const dopt_create_args& args) {
  const Settings s = settings_of(args);
  const Api* a = nullptr;
  int device = -1;
  try {
    a = &api();
    device = pick_device(*a, s, args.local_rank);
  } catch (const sdk::Error& e) {
    publish_failure(args, e.what());  // the other ranks fail now, not at timeout_s
    throw;
  }
  const ncclUniqueId id = exchange_unique_id(*a, args, s);
  ncclComm_t comm = init_comm(*a, id, args.world_size, args.rank, s);
  return std::make_shared<CommState>(*a, s, args.rank, args.world_size, device, comm);
}

/// NCCL's type for a DLPack dtype; UNSUPPORTED otherwise.
ncclDataType_t nccl_type(DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return ncclFloat32;
    if (t.code == kDLFloat && t.bits == 64) return ncclFloat64;
    if (t.code == kDLFloat && t.bits == 16) return ncclFloat16;
    if (t.code == kDLBfloat && t.bits == 16) return ncclBfloat16;
    if (t.code == kDLInt && t.bits == 32) return ncclInt32;
    if (t.code == kDLInt && t.bits == 64) return ncclInt64;
    if (t.code == kDLInt && t.bits == 8) return ncclInt8;
    if (t.code == kDLUInt && t.bits == 8) return ncclUint8;
    if (t.code == kDLUInt && t.bits == 32) return ncclUint32;
    if (t.code == kDLUInt && t.bits == 64) return ncclUint64;
  }
  throw sdk::Error(DOPT_ERR_UNSUPPORTED, "dtype (code " + std::to_string(t.code) + ", " +
                                             std::to_string(t.bits) + " bits, " +
                                             std::to_string(t.lanes) + " lanes) has no NCCL type");
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
    case ncclFloat16:
      return "float16";
    case ncclBfloat16:
      return "bfloat16";
    case ncclInt32:
      return "int32";
    case ncclInt64:
      return "int64";
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclUint32:
      return "uint32";
    case ncclUint64:
      return "uint64";
    default:
      return "?";
  }
}

ncclRedOp_t nccl_op(dopt_reduce_op op) {
  switch (op) {
    case DOPT_REDUCE_SUM:
      return ncclSum;
    case DOPT_REDUCE_AVG:
      return ncclAvg;
    case DOPT_REDUCE_MIN:
      return ncclMin;
    case DOPT_REDUCE_MAX:
      return ncclMax;
    default:
      break;
  }
  throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "unknown reduction " + std::to_string(op));
}

// The NCCL op for `op` in a world of `world` ranks. At one rank the average
// is the sum: NCCL runs ncclAvg on floats as a pre-multiplied sum, a kernel
// that reads and writes every element even in place (8 bytes per fp32
// element per bucket on the H200, 2026-11-26), where an in-place ncclSum at
// one rank launches nothing.
ncclRedOp_t nccl_op(dopt_reduce_op op, int world) {
  return op == DOPT_REDUCE_AVG && world == 1 ? ncclSum : nccl_op(op);
}

/// A checked tensor argument: its device pointer, element count and type.
struct Buf {
  void* data;
  size_t count;
  ncclDataType_t type;
};

Buf buf_of(const DLTensor& t, int device, const char* op, const char* arg) {
  const std::string where = std::string(op) + ": " + arg;
  if (t.device.device_type != kDLCUDA)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, where +
                                               " is not kDLCUDA memory (nccl moves device "
                                               "memory only)");
  if (t.device.device_id != device)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     where + " is on CUDA device " + std::to_string(t.device.device_id) +
                         ", the communicator on device " + std::to_string(device));
  if (t.strides) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect)
        throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, where + " is not contiguous");
      expect *= t.shape[i];
    }
  }
  Buf b{static_cast<char*>(t.data) + t.byte_offset, sdk::dl_numel(t), nccl_type(t.dtype)};
  if (!t.data && b.count > 0) throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, where + " has no data");
  return b;
}

std::string describe(const std::string& name, const Buf& b) {
  return name + " (" + std::to_string(b.count) + " " + type_name(b.type) + ")";
}

void same_type(const Buf& s, const Buf& r, const char* op) {
  if (s.type != r.type)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string(op) + ": send is " + type_name(s.type) +
                                                    ", recv " + type_name(r.type));
}

void check_rank(int r, int world, const char* op, const char* what) {
  if (r < 0 || r >= world)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string(op) + ": " + what + " " +
                                                    std::to_string(r) + " is not in [0, " +
                                                    std::to_string(world) + ")");
}

}  // namespace

NcclComm::NcclComm(const dopt_create_args& args) : state_(make_core(args)) {}

NcclComm::~NcclComm() { state_->shutdown(); }

std::unique_ptr<sdk::Request> NcclComm::allreduce(const DLTensor& send, DLTensor& recv,
                                                  dopt_reduce_op op) {
  Buf s = buf_of(send, state_->device, "allreduce", "send");
  Buf r = buf_of(recv, state_->device, "allreduce", "recv");
  same_type(s, r, "allreduce");
  if (s.count != r.count)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "allreduce: send has " + std::to_string(s.count) +
                                                    " elements, recv " + std::to_string(r.count));
  const ncclRedOp_t nop = nccl_op(op, state_->world);
  CommState& c = *state_;
  return c.launch(describe(c.next_name("allreduce"), s), [&](ncclComm_t nc, cudaStream_t st) {
    return c.a.ncclAllReduce(s.data, r.data, s.count, s.type, nop, nc, st);
  });
}

std::unique_ptr<sdk::Request> NcclComm::reduce_scatter(const DLTensor& send, DLTensor& recv,
                                                       dopt_reduce_op op) {
  Buf s = buf_of(send, state_->device, "reduce_scatter", "send");
  Buf r = buf_of(recv, state_->device, "reduce_scatter", "recv");
  same_type(s, r, "reduce_scatter");
  if (s.count != r.count * static_cast<size_t>(state_->world))
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "reduce_scatter: send has " + std::to_string(s.count) +
                         " elements, not world_size * recv = " +
                         std::to_string(r.count * static_cast<size_t>(state_->world)));
  const ncclRedOp_t nop = nccl_op(op, state_->world);
  CommState& c = *state_;
  return c.launch(describe(c.next_name("reduce_scatter"), s), [&](ncclComm_t nc, cudaStream_t st) {
    return c.a.ncclReduceScatter(s.data, r.data, r.count, s.type, nop, nc, st);
  });
}

std::unique_ptr<sdk::Request> NcclComm::allgather(const DLTensor& send, DLTensor& recv) {
  Buf s = buf_of(send, state_->device, "allgather", "send");
  Buf r = buf_of(recv, state_->device, "allgather", "recv");
  same_type(s, r, "allgather");
  if (r.count != s.count * static_cast<size_t>(state_->world))
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "allgather: recv has " + std::to_string(r.count) +
                         " elements, not world_size * send = " +
                         std::to_string(s.count * static_cast<size_t>(state_->world)));
  CommState& c = *state_;
  return c.launch(describe(c.next_name("allgather"), s), [&](ncclComm_t nc, cudaStream_t st) {
    return c.a.ncclAllGather(s.data, r.data, s.count, s.type, nc, st);
  });
}

std::unique_ptr<sdk::Request> NcclComm::broadcast(DLTensor& buf, int32_t root) {
  Buf b = buf_of(buf, state_->device, "broadcast", "buf");
  check_rank(root, state_->world, "broadcast", "root");
  CommState& c = *state_;
  return c.launch(describe(c.next_name("broadcast"), b) + " from rank " + std::to_string(root),
                  [&](ncclComm_t nc, cudaStream_t st) {
                    return c.a.ncclBroadcast(b.data, b.data, b.count, b.type, root, nc, st);
                  });
}

std::unique_ptr<sdk::Request> NcclComm::send(const DLTensor& buf, int32_t peer, int32_t) {
  Buf b = buf_of(buf, state_->device, "send", "buf");
  check_rank(peer, state_->world, "send", "peer");
  return state_->queue_p2p(
      true, b.data, b.count, b.type, peer,
      describe(state_->next_name("send"), b) + " to rank " + std::to_string(peer));
}

std::unique_ptr<sdk::Request> NcclComm::recv(DLTensor& buf, int32_t peer, int32_t) {
  Buf b = buf_of(buf, state_->device, "recv", "buf");
  check_rank(peer, state_->world, "recv", "peer");
  return state_->queue_p2p(
      false, b.data, b.count, b.type, peer,
      describe(state_->next_name("recv"), b) + " from rank " + std::to_string(peer));
}

std::unique_ptr<sdk::Request> NcclComm::barrier() {
  CommState& c = *state_;
  return c.launch(c.next_name("barrier"), [&](ncclComm_t nc, cudaStream_t st) {
    return c.a.ncclAllReduce(c.scratch(), c.scratch(), 1, ncclInt32, ncclSum, nc, st);
  });
}

std::unique_ptr<sdk::Communicator> NcclComm::split(int32_t color, int32_t key) {
  std::shared_ptr<CommState> child = state_->split(color, key);
  if (!child) return nullptr;
  return std::make_unique<NcclComm>(std::move(child));
}

}  // namespace distopt::plugins::nccl
