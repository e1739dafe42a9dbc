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
//
// Parameter sharding (algorithm.h ABI 1.8): a unit's fp32 bucket has memory
// only from its unscale_bucket until release_bucket (like the unit's bucket
// in the BucketManager), and once the algorithm took its shards the unit's
// masters are dropped (drop_master): the algorithm's fp32 shards are the
// masters then.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distopt/reducer.h"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/bucket_manager.hpp"
#include "optim/storage.hpp"

namespace distopt::optim {

/// Not copyable or movable (descriptors point into it). Not thread-safe: the
/// training thread calls unscale_grads / copy_to_model between backward passes.
class MasterWeights {
 public:
  /// `params` as given to the BucketManager `lp` (same order). Masters start
  /// as exact fp32 copies of the (already broadcast) model parameters.
  /// `initial` (may be null): fp32 values by parameter name for the masters
  /// instead of the model's (a rebuild carries the old optimizer's masters,
  /// which hold what the low-precision model rounds away).
  MasterWeights(const std::vector<std::pair<std::string, at::Tensor>>& params,
                const BucketManager& lp,
                const std::map<std::string, at::Tensor>* initial = nullptr);
  MasterWeights(const MasterWeights&) = delete;
  MasterWeights& operator=(const MasterWeights&) = delete;

  /// fp32 master of parameter i (the parameter itself when it is not a
  /// low-precision floating tensor). Detached, contiguous; undefined once
  /// dropped (a sharded unit's parameter).
  const at::Tensor& master(size_t i) const { return masters_[i]; }
  /// Parameter sharding, after the algorithm's create: parameter i's master
  /// lives in the algorithm's shards; free this copy, and let go of the
  /// model's tensor (a detached alias would keep the unit's whole
  /// low-precision memory after the unit points its parameter elsewhere).
  void drop_master(size_t i) {
    masters_[i] = at::Tensor();
    params_[i] = at::Tensor();
  }
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
  /// nearest, as Tensor::copy_ does); dropped masters are skipped.
  void copy_to_model();

  /// Parameter sharding: buckets for which `sharded[b]` is true get their
  /// fp32 memory from `pool` in unscale_bucket and give it back in
  /// release_bucket. Call before the first backward.
  void shard_buckets(const std::vector<bool>& sharded, std::shared_ptr<StoragePool> pool);
  /// During backward (bucket b of the low-precision manager is complete):
  /// fp32 bucket b = low-precision bucket b (upcast) / scale, and note
  /// whether it holds an inf or NaN (no device sync: take_found_inf reads it).
  void unscale_bucket(size_t b, double scale);
  /// True when a bucket unscaled since the last call held an inf or NaN on
  /// this rank (reads the flag: a device sync). Resets the flag.
  bool take_found_inf();
  /// A sharded fp32 bucket's memory goes back (no-op for the others).
  void release_bucket(size_t b);
  /// fp32 bucket b's flat buffer (no memory for a unit's between steps).
  const at::Tensor& flat(size_t b) const { return flats_.at(b); }
  /// Whether fp32 bucket b aliases its low-precision bucket (fp32 models).
  bool aliases_model_bucket(size_t b) const { return flats_.at(b).is_same(lp_flats_.at(b)); }

 private:
  std::vector<at::Tensor> params_;   // the model's tensors (detached)
  std::vector<at::Tensor> masters_;  // fp32 masters (alias params_[i] when already fp32)
  std::vector<at::Tensor> grads_;    // views into flats_
  std::vector<at::Tensor> lp_flats_,
      flats_;  // per bucket; flats_[b] aliases lp_flats_[b] when fp32
  std::deque<sdk::DLView> flat_dl_;
  std::vector<dopt_bucket> descs_;
  std::vector<bool> sharded_;          // per bucket: memory only while a step needs it
  std::shared_ptr<StoragePool> pool_;  // where sharded buckets' memory comes from
  at::Tensor found_inf_;               // bool scalar on the buckets' device, or undefined
};

}  // namespace distopt::optim
