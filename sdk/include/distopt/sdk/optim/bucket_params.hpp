// The parameters of one gradient bucket packed into a flat buffer laid out
// like the bucket (entry e at its offset, padding zero), for algorithms that
// send parameters rather than gradients bucket by bucket (local SGD's
// averaging, decentralized gossip and its low-precision variant). Torch.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "distopt/reducer.h"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::sdk {

/// Views of the parameters `bucket` names and a buffer of the bucket flat's
/// length and dtype. The bucket and the parameters must outlive it. Not
/// thread-safe.
class BucketParams {
 public:
  /// `params`: per dopt_param index the parameter (undefined for frozen
  /// ones, as WholeParams::by_index()). Throws Error(INVALID_ARGUMENT)
  /// naming `component` and the entry when an entry names no trainable parameter
  /// or its element count differs from the parameter's.
  BucketParams(const dopt_bucket& bucket, const std::vector<at::Tensor>& params,
               const std::string& component)
      : bucket_(&bucket) {
    for (size_t e = 0; e < bucket.num_entries; ++e) {
      const dopt_bucket_entry& en = bucket.entries[e];
      const std::string name = en.name ? en.name : "?";
      if (en.param_index < 0 || static_cast<size_t>(en.param_index) >= params.size() ||
          !params[en.param_index].defined())
        throw Error(DOPT_ERR_INVALID_ARGUMENT,
                    component + ": bucket entry " + name + " names no trainable parameter");
      const at::Tensor& p = params[en.param_index];
      if (static_cast<size_t>(p.numel()) != en.numel)
        throw Error(DOPT_ERR_INVALID_ARGUMENT,
                    component + ": bucket entry " + name + " has " + std::to_string(en.numel) +
                        " elements, its parameter " + std::to_string(p.numel()));
      views_.push_back(p.view({-1}));
    }
  }

  /// Copy the parameters into buffer() and return it (1-D, the flat's
  /// length and dtype; padding stays 0).
  at::Tensor& pack() {
    pack_into(buffer());
    return buffer_;
  }
  /// Copy the parameters into `flat` (1-D, laid out like the bucket, the
  /// parameters' dtype); its padding is left as it is.
  void pack_into(at::Tensor& flat) const {
    at::NoGradGuard ng;
    for (size_t e = 0; e < views_.size(); ++e) slot(flat, e).copy_(views_[e]);
  }
  /// Write each entry's elements of `flat` (laid out like the bucket) back
  /// into its parameter.
  void unpack(const at::Tensor& flat) {
    at::NoGradGuard ng;
    for (size_t e = 0; e < views_.size(); ++e) views_[e].copy_(slot(flat, e));
  }
  /// The packing buffer (zeros of the flat's length and dtype, made on first use).
  at::Tensor& buffer() {
    if (!buffer_.defined()) buffer_ = at::zeros_like(as_tensor(*bucket_->flat));
    return buffer_;
  }
  /// Bytes of buffer(): what one copy of the bucket's parameters puts on the wire.
  uint64_t nbytes() const {
    const at::Tensor flat = as_tensor(*bucket_->flat);
    return static_cast<uint64_t>(flat.numel()) * flat.element_size();
  }

 private:
  at::Tensor slot(const at::Tensor& flat, size_t e) const {
    return flat.narrow(0, static_cast<int64_t>(bucket_->entries[e].offset),
                       static_cast<int64_t>(bucket_->entries[e].numel));
  }

  const dopt_bucket* bucket_;
  at::Tensor buffer_;
  std::vector<at::Tensor> views_;  // per entry: its parameter, flat
};

}  // namespace distopt::sdk
