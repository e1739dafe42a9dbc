// Private: fp32 master weights and fp32 gradient buckets of a mixed-precision
// DistributedOptimizer (apex FP16_Optimizer / mlbench FP16Optimizer layout).
//
// The model's parameters are low precision (bf16/fp16); backward writes their
// gradients into the BucketManager's low-precision buckets. This class keeps
//  - an fp32 master copy of every low-precision parameter (fp32 parameters
//    are their own master), and
//  - an fp32 bucket per low-precision bucket with the same entries (offsets in
//    elements, shapes), whose entry views are the masters' gradients.
// The algorithm plugin only ever sees masters and fp32 buckets, so every
// plugin works unchanged.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "distopt/reducer.h"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/bucket_manager.hpp"

namespace distopt::optim {

/// Not copyable or movable (descriptors point into it). Not thread-safe: the
/// training thread calls unscale_grads / copy_to_model between backward passes.
class MasterWeights {
 public:
  /// `params` as given to the BucketManager `lp` (same order). Masters start
  /// as exact fp32 copies of the (already broadcast) model parameters.
  MasterWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                const BucketManager& lp);
  MasterWeights(const MasterWeights&) = delete;
  MasterWeights& operator=(const MasterWeights&) = delete;

  /// fp32 master of parameter i (the parameter itself when it is not a
  /// low-precision floating tensor). Detached, contiguous.
  const at::Tensor& master(size_t i) const { return masters_[i]; }
  /// fp32 gradient view of parameter i in its master bucket (undefined for a
  /// frozen parameter).
  const at::Tensor& master_grad(size_t i) const { return grads_[i]; }

  /// fp32 bucket descriptors, same count, order and entries as lp's buckets.
  const dopt_bucket* buckets() const { return descs_.data(); }
  size_t num_buckets() const { return descs_.size(); }
  uint64_t bucket_bytes(size_t b) const;

  /// master buckets = low-precision buckets (upcast) / scale. Returns true
  /// when any element is inf or NaN (on this rank).
  bool unscale_grads(double scale);
  /// Copy every master into its low-precision model parameter (rounding to
  /// nearest, as Tensor::copy_ does).
  void copy_to_model();

 private:
  std::vector<at::Tensor> params_;   // the model's tensors (detached)
  std::vector<at::Tensor> masters_;  // fp32 masters (alias params_[i] when already fp32)
  std::vector<at::Tensor> grads_;    // views into flats_
  std::vector<at::Tensor> lp_flats_,
      flats_;  // per bucket; flats_[b] aliases lp_flats_[b] when fp32
  std::deque<sdk::DLView> flat_dl_;
  std::vector<dopt_bucket> descs_;
};

}  // namespace distopt::optim
