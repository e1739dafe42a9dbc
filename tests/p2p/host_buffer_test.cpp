// The SDK's argument checks for host-memory communicators
// (sdk/collective/host_buffer.hpp, used by tcp and ucx): every bad tensor is refused
// with the status and words a user sees, and a good one is read exactly.
#include "distopt/sdk/collective/host_buffer.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "distopt/sdk/base/plugin.hpp"

using namespace distopt::sdk;

namespace {

DLTensor tensor(void* data, int64_t* shape, int ndim, DLDataType dt) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

// The status and message host_buffer throws for t ("" and DOPT_OK if none).
std::pair<dopt_status, std::string> refusal(const DLTensor& t, bool reduce = false) {
  try {
    host_buffer(t, "tcp", "allreduce", "send", reduce);
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {DOPT_OK, ""};
}

}  // namespace

TEST_CASE("host_buffer reads a dense host tensor: data + byte_offset, count, element size") {
  std::vector<float> v(12);
  int64_t shape[2] = {3, 4};
  DLTensor t = tensor(v.data(), shape, 2, {kDLFloat, 32, 1});
  t.byte_offset = 8;
  DType dt{};
  const HostBuffer b = host_buffer(t, "tcp", "allreduce", "send", true, &dt);
  CHECK(b.data == reinterpret_cast<char*>(v.data()) + 8);
  CHECK(b.count == 12);
  CHECK(b.elem_size == 4);
  CHECK(b.bytes() == 48);
  CHECK(dt == DType::F32);
  int64_t strides[2] = {4, 1};  // explicit compact strides are dense too
  t.strides = strides;
  CHECK(host_buffer(t, "tcp", "allreduce", "send").count == 12);
  int64_t empty_shape[1] = {0};  // no elements: a NULL pointer is fine
  CHECK(host_buffer(tensor(nullptr, empty_shape, 1, {kDLInt, 64, 1}), "tcp", "x", "y").count == 0);
}

TEST_CASE(
    "host_buffer refuses what a host-memory communicator cannot move, naming op and argument") {
  std::vector<float> v(12);
  int64_t shape[2] = {3, 4};
  DLTensor t = tensor(v.data(), shape, 2, {kDLFloat, 32, 1});

  DLTensor gpu = t;
  gpu.device = {kDLCUDA, 0};
  auto r = refusal(gpu);
  CHECK(r.first == DOPT_ERR_UNSUPPORTED);
  CHECK(r.second == "allreduce: send is not in host memory (tcp moves host memory only)");

  int64_t strides[2] = {1, 3};  // a transposed view
  DLTensor strided = t;
  strided.strides = strides;
  r = refusal(strided);
  CHECK(r.first == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(r.second == "allreduce: send is not contiguous");

  DLTensor nulldata = t;
  nulldata.data = nullptr;
  r = refusal(nulldata);
  CHECK(r.first == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(r.second == "allreduce: send has a NULL data pointer");

  int64_t negative[1] = {-1};
  r = refusal(tensor(v.data(), negative, 1, {kDLFloat, 32, 1}));
  CHECK(r.first == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(r.second == "allreduce: send has a negative dimension");

  r = refusal(tensor(v.data(), nullptr, 2, {kDLFloat, 32, 1}));
  CHECK(r.first == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(r.second == "allreduce: send has an invalid shape");

  r = refusal(tensor(v.data(), shape, 2, {kDLUInt, 1, 1}));  // bool-like bits
  CHECK(r.first == DOPT_ERR_UNSUPPORTED);
  CHECK(r.second.find("not a whole number of bytes") != std::string::npos);

  // Movable but not reducible: uint8 passes without reduce, not with it.
  const DLTensor u8 = tensor(v.data(), shape, 2, {kDLUInt, 8, 1});
  CHECK(refusal(u8).first == DOPT_OK);
  r = refusal(u8, true);
  CHECK(r.first == DOPT_ERR_UNSUPPORTED);
  CHECK(r.second ==
        "allreduce: send dtype is not one of float32, float64, bfloat16, float16, int32, int64");
}

TEST_CASE("require_reduce_op and require_same_dtype") {
  require_reduce_op(DOPT_REDUCE_MAX, "allreduce");
  try {
    require_reduce_op(static_cast<dopt_reduce_op>(99), "allreduce");
    FAIL("reduce op 99 accepted");
  } catch (const Error& e) {
    CHECK(e.status() == DOPT_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()) == "allreduce: unknown reduce op 99");
  }
  HostBuffer a, b;
  a.dtype = {kDLFloat, 32, 1};
  b.dtype = {kDLFloat, 32, 1};
  require_same_dtype(a, b, "allgather");
  b.dtype = {kDLBfloat, 16, 1};
  try {
    require_same_dtype(a, b, "allgather");
    FAIL("float32 and bfloat16 accepted as one dtype");
  } catch (const Error& e) {
    CHECK(e.status() == DOPT_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()) == "allgather: send and recv have different dtypes");
  }
}

TEST_CASE("a reduce op from a C caller is checked as an integer before it is used as the enum") {
  // What a C caller may pass: bits outside the enum's range, written with
  // memcpy (loading them as the C++ enum, even to copy it, is undefined).
  for (int32_t bits : {0, 1, 2, 3, 4, 42, -1}) {
    dopt_reduce_op op;
    std::memcpy(&op, &bits, sizeof op);
    if (bits >= 0 && bits <= 3) {
      CHECK(detail::abi_reduce_op(op, "allreduce") == static_cast<dopt_reduce_op>(bits));
      continue;
    }
    try {
      detail::abi_reduce_op(op, "reduce_scatter");
      FAIL("reduce op " << bits << " accepted");
    } catch (const Error& e) {
      CHECK(e.status() == DOPT_ERR_INVALID_ARGUMENT);
      CHECK(std::string(e.what()) == "reduce_scatter: unknown reduce op " + std::to_string(bits));
    }
  }
}
