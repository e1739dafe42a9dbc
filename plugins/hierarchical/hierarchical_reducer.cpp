#include "hierarchical_reducer.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "distopt/sdk/base/tensor_state.hpp"
#include "distopt/sdk/base/traffic.hpp"

namespace distopt::plugins::hierarchical {

namespace {

constexpr const char* kWho = "hierarchical";
constexpr int32_t kGatherTag = 0x4849;  // leader variant: shards sent to local rank 0
const std::string kNodesKey = "hierarchical/node_of_rank";

sdk::Error bad(const std::string& msg) {
  return sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "hierarchical: " + msg);
}

std::string ranks_text(const std::vector<int32_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// x / w for every element, as `tcp`'s DOPT_REDUCE_AVG divides: float32 and
// float64 in their own precision (a true division, not a multiplication by
// 1/w), 16-bit floats widened to float32 and rounded once, integers
// truncated. On integer-valued data this makes the result bitwise `mean`'s.
// libtorch ops on t's device (no host round trip). The divisor is a 0-dim
// tensor on that device: CUDA turns a division by a host scalar into a
// multiplication by its reciprocal, which is not tcp's rounding.
void divide(const at::Tensor& t, int64_t w) {
  if (w <= 1 || t.numel() == 0) return;
  auto divisor = [&](at::ScalarType type) {
    return at::full({}, static_cast<double>(w), at::TensorOptions().dtype(type).device(t.device()));
  };
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
      t.div_(divisor(t.scalar_type()));
      break;
    case at::kInt:
    case at::kLong:
      t.div_(divisor(t.scalar_type()), "trunc");
      break;
    default:  // bfloat16, float16: w in float32 (a 16-bit w would round above 256 / 2048)
      t.copy_(t.to(at::kFloat).div_(divisor(at::kFloat)));
  }
}

bool supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf ||
         t == at::kInt || t == at::kLong;
}

uint64_t nbytes(int64_t numel, const at::Tensor& like) {
  return static_cast<uint64_t>(numel) * static_cast<uint64_t>(like.element_size());
}

}  // namespace

// ---------------------------------------------------------------------------
// Requests

/// The collective a bucket failed in, kept so that the request's wait can
/// report the communicator's own message on the waiting thread (the host's
/// error sink is per thread; the worker's would be lost).
struct HierarchicalReducer::Failure {
  std::mutex mu;
  sdk::CommHandle comm;
  sdk::ReduceHandle inner;
};

struct HierarchicalReducer::Job {
  dopt_bucket bucket{};  // the host's descriptor (its arrays stay the host's)
  at::Tensor flat;       // aliases the host's bucket buffer
  std::shared_ptr<sdk::Completion> done;
  std::shared_ptr<Failure> failure;
};

namespace {

class HierarchicalRequest : public sdk::Request {
 public:
  HierarchicalRequest(std::shared_ptr<sdk::Completion> done,
                      std::shared_ptr<HierarchicalReducer::Failure> failure)
      : done_(std::move(done)), failure_(std::move(failure)) {}
  bool test() override {
    try {
      return done_->test();
    } catch (const sdk::Error&) {
      report();
      throw;
    }
  }
  bool wait(int64_t timeout_ms) override {
    try {
      return done_->wait(timeout_ms);
    } catch (const sdk::Error&) {
      report();
      throw;
    }
  }

 private:
  // Ask the failed collective again, on this thread: its test() throws
  // with the communicator's message (which peer, which operation) in this
  // thread's error sink. A collective still running (our wait timed out
  // first) is left alone, and the worker's message stands.
  void report() {
    std::lock_guard<std::mutex> lk(failure_->mu);
    if (failure_->comm.valid()) failure_->comm.test();
    if (failure_->inner.valid()) failure_->inner.test();
  }
  std::shared_ptr<sdk::Completion> done_;
  std::shared_ptr<HierarchicalReducer::Failure> failure_;
};

}  // namespace

// ---------------------------------------------------------------------------
// Creation

void HierarchicalReducer::check_job(const sdk::JobView& job) {
  const sdk::JobComponentView self = job.self();
  if (!self.has_inner()) return;
  const sdk::JobComponentView inner = self.inner();
  if (inner.has_trait(DOPT_TRAIT_WRAPS_REDUCER))
    job.reject("reducer.inner.name",
               "hierarchical cannot wrap reducer '" + inner.name() +
                   "', which wraps another itself; choose the reducer for the cross-node "
                   "step (e.g. powersgd, topk, mean)");
  if (self.options().get_string("variant") != "leader")
    job.reject("reducer.options.variant",
               "an inner reducer runs between the node leaders on whole buckets (reducer '" +
                   inner.name() +
                   "' sees every parameter with its shape, as PowerSGD needs); the ring "
                   "variant's cross-node step works on 1-D pieces cut through parameters. "
                   "Set variant: leader",
               DOPT_ERR_UNSUPPORTED);
}

HierarchicalReducer::HierarchicalReducer(const dopt_create_args& args, dopt_comm_ref comm,
                                         const dopt_bucket* buckets, size_t num_buckets)
    : parent_(comm), rank_(args.rank), world_(args.world_size) {
  if (!comm.vt || !comm.comm) throw bad("no communicator");
  if (parent_.world_size() != world_)
    throw bad("communicator has " + std::to_string(parent_.world_size()) + " ranks, job has " +
              std::to_string(world_));
  const sdk::OptionsView o(args.options);
  leader_variant_ = o.get_string("variant") == "leader";
  if (auto info = sdk::inner_reducer_info(args.options)) {
    inner_name_ = info->name;
    if (!leader_variant_)
      throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                       "hierarchical: an inner reducer runs with variant: leader only");
  }
  std::string name;
  try {
    name = node_name(rank_, world_, std::getenv("DISTOPT_NODE_ID"));
  } catch (const std::invalid_argument& e) {
    throw bad(e.what());
  }
  // Every rank's node: one allgather of an int64 key each, in the buckets'
  // memory (a device-only communicator takes no host tensor).
  const at::Device device =
      num_buckets > 0 && buckets[0].flat ? sdk::to_device(buckets[0].flat->device) : at::kCPU;
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor keys = at::empty({world_}, i64);
  at::Tensor mine = at::full({1}, node_key(name), i64);
  {
    sdk::DLView s(mine), r(keys);
    parent_.allgather(*s.get(), *r.get()).wait();
  }
  keys = keys.to(at::kCPU);
  layout_ = make_layout(
      std::vector<int64_t>(keys.data_ptr<int64_t>(), keys.data_ptr<int64_t>() + world_), rank_);
  make_communicators(args, buckets, num_buckets);
  if (rank_ == 0)
    sdk::log_info(kWho, std::string("variant ") + (leader_variant_ ? "leader" : "ring") + " over " +
                            layout_.describe() +
                            (inner_name_.empty() ? ""
                                                 : "; inner reducer '" + inner_name_ +
                                                       "' between the node leaders"));
}

// Every split is collective over the parent: the calls depend only on the
// layout, which every rank knows whole, so every rank makes the same ones.
void HierarchicalReducer::make_communicators(const dopt_create_args& args,
                                             const dopt_bucket* buckets, size_t num_buckets) {
  const NodeLayout& l = layout_;
  if (l.max_local_size() > 1) intra_comm_ = parent_.split(l.node(), rank_);
  if (!leader_variant_) {
    if (l.num_nodes() < 2) return;
    const auto pieces = static_cast<size_t>(l.max_local_size());
    piece_comms_.resize(pieces);
    piece_group_.resize(pieces);
    for (size_t k = 0; k < pieces; ++k) {
      for (int32_t n = 0; n < l.num_nodes(); ++n)
        piece_group_[k].push_back(l.members[n][PiecePlan::holder(k, l.node_size[n])]);
      const bool holds = PiecePlan::holder(k, l.local_size()) == l.local();
      piece_comms_[k] = parent_.split(holds ? 0 : -1, l.node());
    }
    return;
  }
  if (l.num_nodes() < 2 && inner_name_.empty()) return;
  for (int32_t n = 0; n < l.num_nodes(); ++n) leader_ranks_.push_back(l.members[n][0]);
  leaders_ = parent_.split(l.local() == 0 ? 0 : -1, l.node());
  if (!leaders_ || inner_name_.empty()) return;
  // The inner sees the leaders' communicator as its whole job.
  dopt_create_args a = args;
  a.rank = leaders_.rank();
  a.world_size = leaders_.world_size();
  a.local_rank = 0;  // one leader per node
  a.local_world_size = 1;
  const std::string prefix = std::string(args.scope ? args.scope : "hierarchical") + "/inner";
  a.scope = prefix.c_str();
  inner_ = sdk::InnerReducer(args.options, a, leaders_.view(), buckets, num_buckets);
}

HierarchicalReducer::~HierarchicalReducer() {
  worker_.stop();  // before the counts below are final and the communicators go
  if (reductions_.load() > 0)
    sdk::log_info(kWho, "rank " + std::to_string(rank_) + " (node " +
                            std::to_string(layout_.node()) + ", local rank " +
                            std::to_string(layout_.local()) + " of " +
                            std::to_string(layout_.local_size()) +
                            "): " + std::to_string(reductions_.load()) + " reductions, " +
                            std::to_string(intra_bytes()) + " bytes sent within the node, " +
                            std::to_string(inter_bytes()) + " to other nodes");
}

uint64_t HierarchicalReducer::inter_bytes() const { return inter_.load() + inner_.bytes_sent(); }

// ---------------------------------------------------------------------------
// Reduction

std::unique_ptr<sdk::Request> HierarchicalReducer::reduce(const dopt_bucket& bucket) {
  if (!bucket.flat) throw bad("bucket without a flat buffer");
  const DLTensor& dl = *bucket.flat;
  if (dl.device.device_type != kDLCPU && dl.device.device_type != kDLCUDA)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, "hierarchical: only CPU and CUDA buckets are supported");
  if (dl.ndim != 1 || (dl.strides && dl.strides[0] != 1))
    throw bad("the bucket's flat buffer must be 1-D contiguous");
  auto job = std::make_shared<Job>();
  job->flat = sdk::as_tensor(dl);  // throws UNSUPPORTED for dtypes DLPack-to-ATen lacks
  if (!supported_dtype(job->flat.scalar_type()))
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, std::string("hierarchical: bucket dtype ") +
                                               c10::toString(job->flat.scalar_type()) +
                                               " is not one tcp reduces");
  ++reductions_;
  if (world_ == 1 && !inner_) return std::make_unique<sdk::DoneRequest>();  // x / 1
  job->bucket = bucket;
  job->done = std::make_shared<sdk::Completion>();
  job->failure = std::make_shared<Failure>();
  auto req = std::make_unique<HierarchicalRequest>(job->done, job->failure);
  worker_.submit(
      [this, job] {
        leader_variant_ ? run_leader(*job) : run_ring(*job);
        // Device memory: the last division or copy may still be queued on the
        // worker's stream; a one-element copy to the host waits for it, so the
        // bucket is final when the request completes, whatever stream reads it.
        if (!job->flat.is_cpu() && job->flat.numel() > 0) (void)job->flat.narrow(0, 0, 1).cpu();
      },
      job->done, "bucket " + std::to_string(bucket.index));
  return req;
}

void HierarchicalReducer::finish(Job& job, sdk::CommHandle& h, const std::string& what,
                                 const std::vector<int32_t>& group) {
  try {
    h.wait();
  } catch (const sdk::Error&) {
    sdk::log_warn(kWho, "rank " + std::to_string(rank_) + ": bucket " +
                            std::to_string(job.bucket.index) + ": the " + what +
                            " failed; in its communicator rank i is global rank " +
                            ranks_text(group) + "[i]");
    std::lock_guard<std::mutex> lk(job.failure->mu);
    job.failure->comm = std::move(h);
    throw;
  }
}

at::Tensor HierarchicalReducer::scratch(int which, int64_t numel, const at::Tensor& like) {
  at::Tensor& s = scratch_[which];
  if (!s.defined() || s.scalar_type() != like.scalar_type() || s.device() != like.device() ||
      s.numel() < numel)
    s = at::empty({numel}, like.options());
  return s.narrow(0, 0, numel);
}

void HierarchicalReducer::add_intra(uint64_t bytes) {
  intra_ += bytes;
  sdk::metric_add("hierarchical.intra_bytes", static_cast<double>(bytes));
  sdk::metric_add("reducer.bytes_sent", static_cast<double>(bytes));
}

void HierarchicalReducer::add_inter(uint64_t bytes) {
  inter_ += bytes;
  sdk::metric_add("hierarchical.inter_bytes", static_cast<double>(bytes));
  sdk::metric_add("reducer.bytes_sent", static_cast<double>(bytes));
}

void HierarchicalReducer::run_ring(Job& job) {
  const at::Tensor& flat = job.flat;
  if (flat.numel() == 0) return;  // the same bucket is empty on every rank
  const NodeLayout& l = layout_;
  const int32_t L = l.local_size(), j = l.local();
  const PiecePlan plan(static_cast<size_t>(flat.numel()), l.max_local_size(), L);
  const auto pc = static_cast<int64_t>(plan.piece);
  const auto blk = static_cast<int64_t>(plan.block());

  // The node's L blocks, local rank j's slots in block j: the reduce-scatter's
  // input and the allgather's output (the bucket itself when no piece moves).
  at::Tensor full = flat;
  if (!plan.in_place()) {
    full = scratch(0, L * blk, flat);
    full.zero_();
    for (int32_t r = 0; r < L; ++r)
      for (size_t s = 0; s < plan.slots; ++s)
        if (const int64_t k = plan.piece_at(r, s); k >= 0) {
          const auto a = static_cast<int64_t>(plan.first(k)),
                     b = static_cast<int64_t>(plan.last(k));
          full.narrow(0, r * blk + static_cast<int64_t>(s) * pc, b - a)
              .copy_(flat.narrow(0, a, b - a));
        }
  }
  // 1. This rank's slots: the node's sums of its pieces.
  at::Tensor mine = full;  // one rank: its block is the node's whole
  if (L > 1) {
    mine = scratch(1, blk, flat);
    sdk::DLView s(full), r(mine);
    auto h = intra_comm_.view().reduce_scatter(*s.get(), *r.get(), DOPT_REDUCE_SUM);
    add_intra(nbytes((L - 1) * blk, flat));
    finish(job, h, "reduce_scatter within node " + std::to_string(l.node()), l.members[l.node()]);
  }
  // 2. Each held piece summed across nodes, by its holders (one per node).
  if (l.num_nodes() > 1) {
    std::vector<sdk::DLView> views;
    views.reserve(plan.slots);  // no reallocation: the DLTensors stay put
    std::vector<std::pair<sdk::CommHandle, size_t>> pending;
    for (size_t s = 0; s < plan.slots; ++s) {
      const int64_t k = plan.piece_at(j, s);
      if (k < 0) continue;
      views.emplace_back(mine.narrow(0, static_cast<int64_t>(s) * pc, pc));
      DLTensor* v = views.back().get();
      pending.emplace_back(piece_comms_[k].view().allreduce(*v, *v, DOPT_REDUCE_SUM),
                           static_cast<size_t>(k));
      add_inter(sdk::ring_allreduce_bytes(nbytes(pc, flat), l.num_nodes()));
    }
    for (auto& [h, k] : pending)
      finish(job, h, "allreduce of piece " + std::to_string(k) + " across nodes", piece_group_[k]);
  }
  // 3. The mean; 4. every slot back to every rank of the node.
  divide(mine, world_);
  if (L > 1) {
    sdk::DLView s(mine), r(full);
    auto h = intra_comm_.view().allgather(*s.get(), *r.get());
    add_intra(nbytes((L - 1) * blk, flat));
    finish(job, h, "allgather within node " + std::to_string(l.node()), l.members[l.node()]);
  }
  if (!plan.in_place())
    for (int32_t r = 0; r < L; ++r)
      for (size_t s = 0; s < plan.slots; ++s)
        if (const int64_t k = plan.piece_at(r, s); k >= 0) {
          const auto a = static_cast<int64_t>(plan.first(k)),
                     b = static_cast<int64_t>(plan.last(k));
          flat.narrow(0, a, b - a)
              .copy_(full.narrow(0, r * blk + static_cast<int64_t>(s) * pc, b - a));
        }
}

void HierarchicalReducer::run_leader(Job& job) {
  const at::Tensor& flat = job.flat;
  const int64_t n = flat.numel();
  if (n == 0) return;
  const NodeLayout& l = layout_;
  const int32_t L = l.local_size(), j = l.local();
  const std::vector<int32_t>& node = l.members[l.node()];
  const std::string here = " within node " + std::to_string(l.node());

  // 1. The node's sum on local rank 0: a reduce-scatter, then the shards to it.
  if (L > 1) {
    const int64_t c = (n + L - 1) / L;
    at::Tensor full = flat;
    if (n != L * c) {
      full = scratch(0, L * c, flat);
      full.zero_();
      full.narrow(0, 0, n).copy_(flat);
    }
    at::Tensor mine = scratch(1, c, flat);
    {
      sdk::DLView s(full), r(mine);
      auto h = intra_comm_.view().reduce_scatter(*s.get(), *r.get(), DOPT_REDUCE_SUM);
      add_intra(nbytes((L - 1) * c, flat));
      finish(job, h, "reduce_scatter" + here, node);
    }
    if (j != 0) {
      sdk::DLView s(mine);
      auto h = intra_comm_.view().send(*s.get(), 0, kGatherTag);
      add_intra(nbytes(c, flat));
      finish(job, h, "send of this rank's shard to its node leader", node);
    } else {
      full.narrow(0, 0, c).copy_(mine);
      std::vector<sdk::DLView> views;
      views.reserve(static_cast<size_t>(L - 1));
      std::vector<sdk::CommHandle> pending;
      for (int32_t p = 1; p < L; ++p) {
        views.emplace_back(full.narrow(0, p * c, c));
        pending.push_back(intra_comm_.view().recv(*views.back().get(), p, kGatherTag));
      }
      for (auto& h : pending) finish(job, h, "receive of the shards" + here, node);
      if (!full.is_same(flat)) flat.copy_(full.narrow(0, 0, n));
    }
  }
  // 2. Across nodes, between the leaders.
  if (j == 0) {
    if (inner_) {
      // The inner averages over the N leaders: sum / W = mean over N of sum x N / W.
      const double scale = static_cast<double>(l.num_nodes()) / static_cast<double>(world_);
      if (scale != 1.0) flat.mul_(scale);
      sdk::ReduceHandle h = inner_.reduce(job.bucket);
      try {
        h.wait();
      } catch (const sdk::Error&) {
        sdk::log_warn(kWho, "rank " + std::to_string(rank_) + ": bucket " +
                                std::to_string(job.bucket.index) + ": inner reducer '" +
                                inner_name_ +
                                "' failed; in its communicator rank i is global rank " +
                                ranks_text(leader_ranks_) + "[i]");
        std::lock_guard<std::mutex> lk(job.failure->mu);
        job.failure->inner = std::move(h);
        throw;
      }
      const uint64_t now = inner_.bytes_sent();
      sdk::metric_add("hierarchical.inter_bytes", static_cast<double>(now - inner_seen_));
      inner_seen_ = now;
    } else {
      if (l.num_nodes() > 1) {
        sdk::DLView v(flat);
        auto h = leaders_.view().allreduce(*v.get(), *v.get(), DOPT_REDUCE_SUM);
        add_inter(sdk::ring_allreduce_bytes(nbytes(n, flat), l.num_nodes()));
        finish(job, h, "allreduce between the node leaders", leader_ranks_);
      }
      divide(flat, world_);
    }
  }
  // 3. The result to every rank of the node (a chain from local rank 0).
  if (L > 1) {
    sdk::DLView v(flat);
    auto h = intra_comm_.view().broadcast(*v.get(), 0);
    if (j < L - 1) add_intra(nbytes(n, flat));
    finish(job, h, "broadcast" + here, node);
  }
}

// ---------------------------------------------------------------------------
// Checkpoints

void HierarchicalReducer::save_state(sdk::StateWriter& w) {
  if (inner_name_.empty()) return;  // no state of its own
  if (rank_ == 0) {
    at::Tensor nodes = at::empty({world_}, at::kLong);
    std::copy(layout_.node_of.begin(), layout_.node_of.end(), nodes.data_ptr<int64_t>());
    sdk::put_whole(w, kNodesKey, nodes);
  }
  if (inner_) inner_.save_state(w);
}

void HierarchicalReducer::load_state(const sdk::StateReader& r) {
  if (inner_name_.empty()) return;
  int32_t saved_nodes = -1;
  if (r.find(kNodesKey)) {
    const at::Tensor saved = sdk::read_whole(r, kNodesKey).to(at::kLong).contiguous().view({-1});
    std::vector<int32_t> v(saved.data_ptr<int64_t>(), saved.data_ptr<int64_t>() + saved.numel());
    saved_nodes = v.empty() ? 0 : *std::max_element(v.begin(), v.end()) + 1;
    if (static_cast<int32_t>(v.size()) == world_ && v != layout_.node_of)
      throw bad("the checkpoint was saved with the ranks on nodes " + ranks_text(v) +
                ", this job has them on " + ranks_text(layout_.node_of) +
                ": the inner reducer's per-leader state would load into other ranks. Resume "
                "with the same nodes (DISTOPT_NODE_ID), or from a checkpoint of another "
                "world size (every leader then starts from the mean)");
  } else if (rank_ == 0) {
    sdk::log_warn(kWho, "checkpoint has no '" + kNodesKey +
                            "' (saved by another reducer): the inner reducer '" + inner_name_ +
                            "' reads its state as that reducer saved it");
  }
  if (!inner_) return;
  dopt_state_reader c = r.c();
  if (saved_nodes > 0) c.saved_world_size = saved_nodes;  // the inner's world: the leaders
  inner_.load_state(sdk::StateReader(c));
}

}  // namespace distopt::plugins::hierarchical
