// Zero-copy bridges between borrowed DLPack tensors and at::Tensor, for
// plugins that do their math with libtorch (and for the host). Neither
// direction copies data or takes ownership:
//   as_tensor(dl)  -> an at::Tensor aliasing dl's memory; the caller keeps the
//                     memory alive (the host does, for parameters/buckets).
//   DLView(t)      -> a DLTensor describing t; it holds a reference to t and
//                     owns the shape/stride arrays the DLTensor points to.
// Supported dtypes: float16/32/64, bfloat16, int8/16/32/64, uint8 (DLPack 0.6 has no bool).
// Devices: kDLCPU and kDLCUDA (device_id = CUDA index).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since libtorch 2.x)

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distopt/abi.h"
#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk {

/// at::ScalarType of a DLPack dtype; throws sdk::Error(UNSUPPORTED) otherwise.
inline at::ScalarType to_scalar_type(DLDataType t) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 16) return at::kHalf;
        if (t.bits == 32) return at::kFloat;
        if (t.bits == 64) return at::kDouble;
        break;
      case kDLBfloat:
        if (t.bits == 16) return at::kBFloat16;
        break;
      case kDLInt:
        if (t.bits == 8) return at::kChar;
        if (t.bits == 16) return at::kShort;
        if (t.bits == 32) return at::kInt;
        if (t.bits == 64) return at::kLong;
        break;
      case kDLUInt:
        if (t.bits == 8) return at::kByte;
        break;
      default:
        break;
    }
  }
  throw Error(DOPT_ERR_UNSUPPORTED, "unsupported DLPack dtype (code " + std::to_string(t.code) +
                                        ", bits " + std::to_string(t.bits) + ", lanes " +
                                        std::to_string(t.lanes) + ")");
}

/// DLPack dtype of an at::ScalarType; throws sdk::Error(UNSUPPORTED) otherwise.
inline DLDataType to_dl_dtype(at::ScalarType s) {
  switch (s) {
    case at::kHalf:
      return {kDLFloat, 16, 1};
    case at::kFloat:
      return {kDLFloat, 32, 1};
    case at::kDouble:
      return {kDLFloat, 64, 1};
    case at::kBFloat16:
      return {kDLBfloat, 16, 1};
    case at::kChar:
      return {kDLInt, 8, 1};
    case at::kShort:
      return {kDLInt, 16, 1};
    case at::kInt:
      return {kDLInt, 32, 1};
    case at::kLong:
      return {kDLInt, 64, 1};
    case at::kByte:
      return {kDLUInt, 8, 1};
    default:
      throw Error(DOPT_ERR_UNSUPPORTED,
                  std::string("unsupported tensor dtype ") + c10::toString(s));
  }
}

inline at::Device to_device(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
      return at::Device(at::kCPU);
    case kDLCUDA:
      return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d.device_id));
    default:
      throw Error(DOPT_ERR_UNSUPPORTED,
                  "unsupported DLPack device type " + std::to_string(d.device_type));
  }
}

inline DLDevice to_dl_device(const at::Device& d) {
  if (d.is_cpu()) return {kDLCPU, 0};
  if (d.is_cuda()) return {kDLCUDA, d.has_index() ? d.index() : 0};
  throw Error(DOPT_ERR_UNSUPPORTED, "unsupported tensor device " + d.str());
}

/// Non-owning at::Tensor over a borrowed DLTensor (shape, strides — NULL
/// meaning compact row-major —, byte_offset, dtype and device honoured). The
/// result aliases dl's memory: writes through it are visible to the owner.
/// It does not require grad.
inline at::Tensor as_tensor(const DLTensor& dl) {
  if (dl.ndim < 0 || (dl.ndim > 0 && !dl.shape))
    throw Error(DOPT_ERR_INVALID_ARGUMENT, "DLTensor with a bad shape");
  std::vector<int64_t> sizes(dl.shape, dl.shape + dl.ndim);
  auto options = at::TensorOptions().dtype(to_scalar_type(dl.dtype)).device(to_device(dl.device));
  auto* base = static_cast<char*>(dl.data) + dl.byte_offset;
  if (dl.strides) {
    std::vector<int64_t> strides(dl.strides, dl.strides + dl.ndim);
    return at::from_blob(base, sizes, strides, options);
  }
  return at::from_blob(base, sizes, options);
}

/// A DLTensor describing an at::Tensor without copying. Keeps a reference to
/// the tensor (its storage stays alive as long as the view). Move-only; the
/// DLTensor pointer from get() changes when the view is moved.
class DLView {
 public:
  DLView() = default;
  explicit DLView(at::Tensor t) : t_(std::move(t)) {
    shape_.assign(t_.sizes().begin(), t_.sizes().end());
    strides_.assign(t_.strides().begin(), t_.strides().end());
    dl_.data = t_.data_ptr();
    dl_.device = to_dl_device(t_.device());
    dl_.ndim = static_cast<int32_t>(t_.dim());
    dl_.dtype = to_dl_dtype(t_.scalar_type());
    dl_.byte_offset = 0;  // data_ptr() already includes the storage offset
    fix();
  }
  DLView(DLView&& o) noexcept
      : t_(std::move(o.t_)),
        shape_(std::move(o.shape_)),
        strides_(std::move(o.strides_)),
        dl_(o.dl_) {
    fix();
  }
  DLView& operator=(DLView&& o) noexcept {
    t_ = std::move(o.t_);
    shape_ = std::move(o.shape_);
    strides_ = std::move(o.strides_);
    dl_ = o.dl_;
    fix();
    return *this;
  }
  DLView(const DLView&) = delete;
  DLView& operator=(const DLView&) = delete;

  DLTensor* get() noexcept { return &dl_; }
  const DLTensor* get() const noexcept { return &dl_; }
  const at::Tensor& tensor() const noexcept { return t_; }

 private:
  void fix() noexcept {
    dl_.shape = shape_.empty() ? nullptr : shape_.data();
    dl_.strides = strides_.empty() ? nullptr : strides_.data();
  }
  at::Tensor t_;
  std::vector<int64_t> shape_, strides_;
  DLTensor dl_{};
};

}  // namespace distopt::sdk
