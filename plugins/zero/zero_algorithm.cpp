#include "zero_algorithm.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/collective/p2p_collectives.hpp"
#include "distopt/sdk/optim/algorithm_args.hpp"
#include "distopt/sdk/optim/flat_shards.hpp"
#include "distopt/sdk/optim/grad_clip.hpp"
#include "distopt/sdk/optim/optimizer_factory.hpp"

namespace distopt::plugins::zero {
namespace {

// A leaf tensor over elements [offset, offset + numel) of a contiguous 1-D
// tensor's memory (the optimizer needs leaves whose .grad it can read).
at::Tensor flat_leaf(const at::Tensor& flat, size_t offset, size_t numel) {
  auto* base = static_cast<char*>(flat.data_ptr()) + offset * flat.element_size();
  return at::from_blob(base, {static_cast<int64_t>(numel)}, flat.options());
}

[[noreturn]] void fail(dopt_status s, const std::string& msg) {
  throw sdk::Error(s, "zero: " + msg);
}

// Bytes one rank sends, as the tcp communicator's network path moves them
// (the shared-memory path copies differently; the reducers count the same
// ring model): a ring reduce-scatter or allgather of W blocks of `block`
// bytes sends W - 1 blocks; a broadcast is the SDK's p2p one
// (sdk/collective/p2p_collectives.hpp, what tcp and ucx run): up to small_bytes the
// root sends to every rank, above a chain root -> root+1 -> ... sends the
// whole buffer from every rank but the last, root - 1.
uint64_t ring_bytes(uint64_t block, int32_t world) {
  return block * static_cast<uint64_t>(world - 1);
}
uint64_t broadcast_bytes(uint64_t bytes, int32_t root, int32_t rank, int32_t world) {
  if (bytes <= sdk::p2p::CollectiveOptions{}.small_bytes)
    return rank == root ? bytes * static_cast<uint64_t>(world - 1) : 0;
  return (rank - root + world) % world < world - 1 ? bytes : 0;
}

}  // namespace

void ZeroAlgorithm::check_job(const sdk::JobView& job) {
  const int64_t stage = job.self().options().get_int("stage");
  if (stage == 1) return;  // stage 1 uses the reducer
  const sdk::JobComponentView red = job.reducer();
  if (red.has_trait(DOPT_TRAIT_EXACT_MEAN)) return;
  job.reject("algorithm.options.stage",
             "stage " + std::to_string(stage) +
                 " reduce-scatters the plain gradients itself and never calls the reducer, so "
                 "reducer '" +
                 red.name() + "' (plugin " + red.plugin() +
                 ") would not apply: its compression, scaling or error feedback would be "
                 "ignored. Use stage: 1 (it hands every bucket to the reducer), or a reducer "
                 "that declares the exact mean (reducer: {name: mean})");
}

ZeroAlgorithm::ZeroAlgorithm(const dopt_algorithm_args& args)
    : rank_(sdk::check_algorithm_args(args, "zero", sdk::kNeedsCommWhenDistributed).rank),
      world_(args.common->world_size),
      comm_(args.comm),
      reducer_(args.reducer) {
  read_options(args);
  at::NoGradGuard ng;
  const std::vector<size_t> trainable = alias_trainable_params(args);
  for (size_t b = 0; b < args.num_buckets; ++b) buckets_.push_back(&args.buckets[b]);
  if (stage_ == 1) {
    reduce_pending_.resize(buckets_.size());
    partitions_.push_back(partition_params(args, trainable));
  } else {
    partition_buckets();
    if (stage_ == 3) take_param_shards(args);
  }
  build_optimizer(args);
  // A unit's parameters are the host's only during create (algorithm.h).
  for (size_t i = 0; i < params_.size(); ++i)
    if (sharded_param_[i]) params_[i] = at::Tensor();
}

int32_t ZeroAlgorithm::param_sharding(const sdk::OptionsView& options) {
  if (options.get_int("stage") != 3) return DOPT_PARAM_SHARDING_NONE;
  return options.get_bool("reshard_after_forward") ? DOPT_PARAM_SHARDING_FULL
                                                   : DOPT_PARAM_SHARDING_KEEP_FOR_BACKWARD;
}

void ZeroAlgorithm::take_param_shards(const dopt_algorithm_args& args) {
  const bool has_flags =
      DOPT_HAS_FIELD(&args, dopt_algorithm_args, bucket_sharded) && args.bucket_sharded;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketShard& s = shards_[b];
    s.sharded = has_flags && args.bucket_sharded[b] != 0;
    if (!s.sharded) continue;
    const FlatPartition& part = partitions_[b];
    s.param_shard = at::zeros({static_cast<int64_t>(part.shard_numel)}, s.flat.options());
    for (const auto& is : part.item_shards) {
      if (is.owner != rank_) continue;
      s.param_shard.narrow(0, static_cast<int64_t>(is.shard_offset), static_cast<int64_t>(is.numel))
          .copy_(param_range(is.id, is.item_offset, is.numel));
      sharded_param_[is.id] = true;
    }
    // Every parameter of the bucket, owned here or not.
    for (size_t e = 0; e < buckets_[b]->num_entries; ++e)
      sharded_param_[static_cast<size_t>(buckets_[b]->entries[e].param_index)] = true;
    s.param_shard_view = sdk::DLView(s.param_shard);
  }
}

void ZeroAlgorithm::gather_params(const dopt_bucket& bucket, DLTensor& full) {
  const size_t b = bucket_slot(bucket);
  BucketShard& s = shards_[b];
  if (stage_ != 3 || !s.sharded)
    fail(DOPT_ERR_INVALID_ARGUMENT,
         "gather_params: bucket " + std::to_string(b) + " holds no sharded unit");
  if (s.gathering.valid() || s.gather_started)
    fail(DOPT_ERR_STATE, "gather_params: bucket " + std::to_string(b) + " is already gathering");
  const int64_t shard = s.param_shard.numel();
  at::Tensor out = sdk::as_tensor(full);
  // ABI 1.8: under mixed precision `full` has the model's dtype (bf16,
  // fp16) and the shard is the fp32 master.
  if (out.dim() != 1 || out.numel() != shard * world_ || !at::isFloatingType(out.scalar_type()))
    fail(DOPT_ERR_INVALID_ARGUMENT, "gather_params: bucket " + std::to_string(b) +
                                        " needs a 1-D floating-point buffer of " +
                                        std::to_string(shard * world_) + " elements");
  s.gather_started = true;
  at::NoGradGuard ng;
  if (world_ == 1) {
    out.copy_(s.param_shard);
    return;
  }
  const DLTensor* send = s.param_shard_view.get();
  if (out.scalar_type() != s.param_shard.scalar_type()) {
    // Round once here and send the model's dtype (FSDP's param_dtype): half
    // the bytes of the fp32 shard, and what every rank would round to anyway.
    s.param_cast = s.param_shard.to(out.scalar_type());
    s.param_cast_view = sdk::DLView(s.param_cast);
    send = s.param_cast_view.get();
  }
  s.gathering = comm_.allgather(*send, full);
  count_sent(ring_bytes(static_cast<uint64_t>(shard * out.element_size()), world_));
}

void ZeroAlgorithm::scatter_params(const dopt_bucket& bucket, const DLTensor& full) {
  const size_t b = bucket_slot(bucket);
  BucketShard& s = shards_[b];
  if (stage_ != 3 || !s.sharded)
    fail(DOPT_ERR_INVALID_ARGUMENT,
         "scatter_params: bucket " + std::to_string(b) + " holds no sharded unit");
  const int64_t shard = s.param_shard.numel();
  at::Tensor in = sdk::as_tensor(full);
  if (in.dim() != 1 || in.numel() != shard * world_ || !at::isFloatingType(in.scalar_type()))
    fail(DOPT_ERR_INVALID_ARGUMENT,
         "scatter_params: bucket " + std::to_string(b) + " needs the buffer gather_params fills");
  at::NoGradGuard ng;
  s.param_shard.copy_(in.narrow(0, shard * rank_, shard));
}

void ZeroAlgorithm::wait_params(const dopt_bucket& bucket) {
  BucketShard& s = shards_[bucket_slot(bucket)];
  if (!s.gather_started)
    fail(DOPT_ERR_STATE,
         "wait_params: no gather of bucket " + std::to_string(bucket.index) + " is pending");
  s.gather_started = false;
  struct DropCast {  // the rounded shard goes once the gather is over, or failed
    BucketShard& s;
    ~DropCast() {
      s.param_cast_view = sdk::DLView();
      s.param_cast = at::Tensor();
    }
  } drop{s};
  if (!s.gathering.valid()) return;
  sdk::CommHandle h = std::move(s.gathering);
  s.gathering.reset();
  h.wait();
}

void ZeroAlgorithm::read_options(const dopt_algorithm_args& args) {
  sdk::OptionsView opts(args.common->options);
  stage_ = opts.get_int("stage");
  partition_kind_ = opts.get_string("partition");
  bucket_view_ = opts.get_bool("parameters_as_bucket_view");
  overlap_comm_ = opts.get_bool("overlap_comm");
  if (stage_ < 1 || stage_ > 3) fail(DOPT_ERR_INVALID_ARGUMENT, "stage must be 1, 2 or 3");
  if (partition_kind_ != "greedy" && partition_kind_ != "contiguous")
    fail(DOPT_ERR_INVALID_ARGUMENT,
         "partition must be greedy or contiguous, not " + partition_kind_);
  if (stage_ == 1 && (!args.reducer.vt || !args.reducer.reducer))
    fail(DOPT_ERR_INVALID_ARGUMENT, "stage 1 needs a reducer");
}

std::vector<size_t> ZeroAlgorithm::alias_trainable_params(const dopt_algorithm_args& args) {
  host_params_ = args.params;
  params_.resize(args.num_params);
  grads_.resize(args.num_params);
  sharded_param_.assign(args.num_params, false);
  std::vector<size_t> trainable;
  c10::optional<at::ScalarType> dtype;
  for (size_t i = 0; i < args.num_params; ++i) {
    const dopt_param& p = args.params[i];
    if (!p.requires_grad || !p.grad) continue;  // frozen: never updated, in no partition
    params_[i] = sdk::as_tensor(*p.data).view(-1);
    grads_[i] = sdk::as_tensor(*p.grad).view(-1);
    if (!params_[i].is_contiguous() || !grads_[i].is_contiguous())
      fail(DOPT_ERR_INVALID_ARGUMENT, std::string("parameter ") + (p.name ? p.name : "?") +
                                          " or its gradient is not contiguous");
    if (dtype && *dtype != params_[i].scalar_type())
      fail(DOPT_ERR_UNSUPPORTED, "all trainable parameters must have one dtype (flat buffers)");
    dtype = params_[i].scalar_type();
    trainable.push_back(i);
  }
  return trainable;
}

FlatPartition ZeroAlgorithm::partition_params(const dopt_algorithm_args& args,
                                              const std::vector<size_t>& trainable) const {
  FlatPartition partition;
  if (partition_kind_ == "greedy") {
    std::vector<ParamSize> sizes;
    for (size_t i : trainable)
      sizes.push_back({static_cast<size_t>(params_[i].numel()), args.params[i].group});
    const auto owners = greedy_partition(sizes, world_);
    std::vector<size_t> fill(static_cast<size_t>(world_), 0);  // per rank: its shard's numel
    for (size_t k = 0; k < trainable.size(); ++k) {
      const auto r = static_cast<size_t>(owners[k]);
      partition.item_shards.push_back({trainable[k], 0, sizes[k].numel, owners[k], fill[r]});
      fill[r] += sizes[k].numel;
    }
    partition.shard_numel = *std::max_element(fill.begin(), fill.end());
    return partition;
  }
  std::vector<size_t> numels;
  for (size_t i : trainable) numels.push_back(static_cast<size_t>(params_[i].numel()));
  partition = partition_range(back_to_back(numels),
                              std::accumulate(numels.begin(), numels.end(), size_t{0}), world_);
  for (auto& s : partition.item_shards) s.id = trainable[s.id];  // item index -> parameter
  return partition;
}

void ZeroAlgorithm::partition_buckets() {
  shards_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const dopt_bucket& bk = *buckets_[b];
    if (bk.index != static_cast<int32_t>(b))
      fail(DOPT_ERR_INVALID_ARGUMENT,
           "bucket " + std::to_string(b) + " has index " + std::to_string(bk.index));
    BucketShard& s = shards_[b];
    s.flat = sdk::as_tensor(*bk.flat).view(-1);
    std::vector<FlatItem> items;
    for (size_t e = 0; e < bk.num_entries; ++e) {
      const auto pi = static_cast<size_t>(bk.entries[e].param_index);
      if (pi >= params_.size() || !params_[pi].defined()) continue;
      items.push_back({pi, bk.entries[e].offset, bk.entries[e].numel});
    }
    FlatPartition partition = partition_range(items, static_cast<size_t>(s.flat.numel()), world_);
    s.shard = at::zeros({static_cast<int64_t>(partition.shard_numel)}, s.flat.options());
    s.shard_view = sdk::DLView(s.shard);
    partitions_.push_back(std::move(partition));
  }
}

void ZeroAlgorithm::build_optimizer(const dopt_algorithm_args& args) {
  // Every group exists (maybe empty) so set_lr works on every rank.
  std::vector<sdk::ParamGroupInput> groups(args.num_groups);
  group_slot_.resize(args.num_groups);
  for (size_t g = 0; g < args.num_groups; ++g) {
    group_slot_[g] = static_cast<int32_t>(g);
    groups[g].lr = args.groups[g].lr;
    groups[g].weight_decay = args.groups[g].weight_decay;
  }
  slices_.resize(args.num_groups);
  for (size_t l = 0; l < partitions_.size(); ++l) {
    for (const auto& is : partitions_[l].item_shards) {
      if (is.owner != rank_) continue;
      at::Tensor t = stage_ == 3 && shards_[l].sharded
                         ? flat_leaf(shards_[l].param_shard, is.shard_offset, is.numel)
                         : flat_leaf(params_[is.id], is.item_offset, is.numel);
      t.mutable_grad() = stage_ == 1 ? flat_leaf(grads_[is.id], is.item_offset, is.numel)
                                     : flat_leaf(shards_[l].shard, is.shard_offset, is.numel);
      const auto g = static_cast<size_t>(args.params[is.id].group);
      owned_.push_back({g, groups[g].params.size(), is.id, is.item_offset, is.numel});
      groups[g].params.push_back(t);
      // The item shard as a range of its parameter: what makes the checkpoint
      // independent of this partition.
      const DLTensor& d = *args.params[is.id].data;
      slices_[g].push_back({args.params[is.id].name ? args.params[is.id].name : "",
                            static_cast<int64_t>(is.item_offset),
                            std::vector<int64_t>(d.shape, d.shape + d.ndim)});
    }
  }
  optimizer_ = sdk::make_optimizer(args.optimizer_name ? args.optimizer_name : "",
                                   sdk::OptionsView(args.optimizer_options), groups);
}

size_t ZeroAlgorithm::bucket_slot(const dopt_bucket& bucket) const {
  if (bucket.index < 0 || static_cast<size_t>(bucket.index) >= buckets_.size())
    fail(DOPT_ERR_INVALID_ARGUMENT, "unknown bucket " + std::to_string(bucket.index));
  return static_cast<size_t>(bucket.index);
}

void ZeroAlgorithm::on_bucket_ready(const dopt_bucket& bucket) {
  const size_t b = bucket_slot(bucket);
  if (stage_ == 1) {
    if (reduce_pending_[b].valid())
      fail(DOPT_ERR_STATE, "bucket " + std::to_string(b) + " is ready twice in one step");
    reduce_pending_[b] = reducer_.reduce(*buckets_[b]);
    return;
  }
  BucketShard& s = shards_[b];
  if (s.pending.valid())
    fail(DOPT_ERR_STATE, "bucket " + std::to_string(b) + " is ready twice in one step");
  at::NoGradGuard ng;
  // A unit's bucket gets fresh memory each step (algorithm.h).
  if (s.sharded) s.flat = sdk::as_tensor(*bucket.flat).view(-1);
  if (world_ == 1) {
    s.shard.copy_(s.flat);
    return;
  }
  const int64_t padded = static_cast<int64_t>(partitions_[b].shard_numel) * world_;
  if (padded == s.flat.numel()) {
    s.send_view = sdk::DLView(s.flat);
  } else {  // reduce_scatter wants W equal blocks: a zero-padded copy, freed at step()
    s.send = at::zeros({padded}, s.flat.options());
    s.send.narrow(0, 0, s.flat.numel()).copy_(s.flat);
    s.send_view = sdk::DLView(s.send);
  }
  s.pending = comm_.reduce_scatter(*s.send_view.get(), *s.shard_view.get(), DOPT_REDUCE_AVG);
  count_sent(ring_bytes(static_cast<uint64_t>(s.shard.nbytes()), world_));
  if (stage_ == 3) finish_earlier_units(b);
}

void ZeroAlgorithm::finish_earlier_units(size_t b) {
  // The host frees the gradients of the units handed before `b` when this
  // returns (algorithm.h): their reduce-scatters must be done. One bucket
  // deep: each overlaps with the backward up to the next unit.
  for (size_t k = 0; k < b; ++k) {
    BucketShard& e = shards_[k];
    if (!e.sharded || !e.pending.valid()) continue;
    sdk::CommHandle h = std::move(e.pending);
    e.pending.reset();
    h.wait();
    e.send_view = sdk::DLView();
    e.send = at::Tensor();
    e.done = true;
  }
}

bool ZeroAlgorithm::finish_buckets() {
  if (stage_ != 3 || overlap_comm_) return false;
  at::NoGradGuard ng;
  finish_earlier_units(shards_.size());
  return true;
}

void ZeroAlgorithm::count_sent(uint64_t bytes) {
  if (bytes == 0) return;
  bytes_sent_ += bytes;
  sdk::metric_add("algorithm.bytes_sent", static_cast<double>(bytes));
}

void ZeroAlgorithm::step() {
  at::NoGradGuard ng;
  try {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (stage_ == 1) {
        if (!reduce_pending_[b].valid())
          fail(DOPT_ERR_STATE, "step() before bucket " + std::to_string(b) + " was ready");
        reduce_pending_[b].wait();
        reduce_pending_[b].reset();
      } else if (world_ > 1) {
        if (shards_[b].done) {  // stage 3: waited for in a later on_bucket_ready
          shards_[b].done = false;
          continue;
        }
        if (!shards_[b].pending.valid())
          fail(DOPT_ERR_STATE, "step() before bucket " + std::to_string(b) + " was ready");
        shards_[b].pending.wait();
        shards_[b].pending.reset();
        shards_[b].send_view = sdk::DLView();
        shards_[b].send = at::Tensor();
      }
    }
  } catch (...) {
    drop_bucket_work();  // a failed step leaves no stale requests
    throw;
  }
  follow_host_params();
  if (grad_clip_ > 0) clip_owned_grads();
  optimizer_->step();
  sync_parameters();
  sdk::metric_add("algorithm.steps", 1);
}

void ZeroAlgorithm::drop_bucket_work() {
  for (auto& p : reduce_pending_) p.reset();
  for (auto& s : shards_) {
    s.pending.reset();
    s.done = false;
    s.send_view = sdk::DLView();
    s.send = at::Tensor();
  }
}

void ZeroAlgorithm::discard_step() {
  at::NoGradGuard ng;
  // Every rank started the same reductions: finish them (the host frees
  // the buckets they read next), then forget their results.
  std::exception_ptr failure;
  auto finish = [&failure](auto& handle) {
    if (!handle.valid()) return;
    try {
      handle.wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  for (auto& p : reduce_pending_) finish(p);
  for (auto& s : shards_) finish(s.pending);
  drop_bucket_work();
  if (failure) std::rethrow_exception(failure);
  sdk::metric_add("algorithm.discarded_steps", 1);
}

void ZeroAlgorithm::set_grad_clip(double max_norm) {
  grad_clip_ = sdk::checked_max_norm(max_norm, "zero");
}

void ZeroAlgorithm::clip_owned_grads() {
  // The item shards of all ranks cover every trainable parameter once
  // (stage 1: ranges of the reduced bucket; stage 2: of the shard), so
  // the squares summed over the ranks are the whole gradient's.
  std::vector<at::Tensor> owned;
  for (const auto& group : optimizer_->param_groups())
    for (const at::Tensor& p : group.params()) owned.push_back(p.grad());
  at::Device device = at::kCPU;
  for (const at::Tensor& g : grads_)
    if (g.defined()) {
      device = g.device();
      break;
    }
  sdk::clip_grad_norm(owned, grad_clip_, sdk::GradParts::sharded, &comm_, device);
}

void ZeroAlgorithm::follow_host_params() {
  std::vector<bool> moved(params_.size(), false);
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined()) continue;
    const DLTensor& d = *host_params_[i].data;
    if (params_[i].data_ptr() == static_cast<char*>(d.data) + d.byte_offset) continue;
    params_[i] = sdk::as_tensor(d).view(-1);
    moved[i] = any = true;
  }
  if (!any) return;
  for (const OwnedShard& o : owned_)
    if (moved[o.param])
      sdk::replace_param(*optimizer_, o.group, o.index,
                         flat_leaf(params_[o.param], o.item_offset, o.numel));
}

void ZeroAlgorithm::sync_parameters() {
  if (world_ == 1) return;
  for (size_t l = 0; l < partitions_.size(); ++l) {
    if (stage_ == 3 && shards_[l].sharded) continue;  // gathered before its next use
    if (bucket_view_)
      sync_by_allgather(partitions_[l]);
    else
      sync_by_broadcast(partitions_[l]);
  }
}

at::Tensor ZeroAlgorithm::param_range(size_t param, size_t offset, size_t numel) const {
  return params_[param].narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(numel));
}

void ZeroAlgorithm::sync_by_allgather(const FlatPartition& partition) {
  if (partition.item_shards.empty()) return;
  const at::ScalarType dtype = params_[partition.item_shards.front().id].scalar_type();
  count_sent(sdk::allgather_shards(
      comm_, partition, rank_, world_, dtype,
      [this](const ItemShard& s) { return param_range(s.id, s.item_offset, s.numel); }));
}

void ZeroAlgorithm::sync_by_broadcast(const FlatPartition& partition) {
  // All broadcasts in flight at once, in the same order on every rank.
  std::vector<sdk::DLView> views;
  std::vector<sdk::CommHandle> pending;
  views.reserve(partition.item_shards.size());
  uint64_t sent = 0;
  for (const auto& s : partition.item_shards) {
    at::Tensor range = param_range(s.id, s.item_offset, s.numel);
    sent += broadcast_bytes(static_cast<uint64_t>(range.nbytes()), s.owner, rank_, world_);
    views.emplace_back(range);
    pending.push_back(comm_.broadcast(*views.back().get(), s.owner));
  }
  for (auto& h : pending) h.wait();
  count_sent(sent);
}

void ZeroAlgorithm::set_lr(int32_t group, double lr) {
  if (group < 0 || static_cast<size_t>(group) >= group_slot_.size())
    fail(DOPT_ERR_INVALID_ARGUMENT, "no parameter group " + std::to_string(group));
  sdk::set_group_lr(*optimizer_, static_cast<size_t>(group_slot_[group]), lr);
}

uint64_t ZeroAlgorithm::state_bytes() const { return sdk::optimizer_state_bytes(*optimizer_); }

void ZeroAlgorithm::save_state(sdk::StateWriter& w) {
  sdk::save_optimizer_state(*optimizer_, slices_, w);
}

void ZeroAlgorithm::load_state(const sdk::StateReader& r) {
  sdk::load_optimizer_state(*optimizer_, slices_, r);
}

}  // namespace distopt::plugins::zero
