#include "powersgd_reducer.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <string>
#include <utility>

#include "distopt/sdk/base/tensor.hpp"
#include "distopt/sdk/base/tensor_state.hpp"
#include "distopt/sdk/base/traffic.hpp"
#include "orthogonalize.hpp"

namespace distopt::plugins::powersgd {

namespace {

constexpr const char* kWho = "powersgd";

sdk::Error bad(const std::string& msg) {
  return sdk::Error(DOPT_ERR_INVALID_ARGUMENT, std::string("powersgd: ") + msg);
}

size_t dtype_bytes(at::ScalarType t) { return static_cast<size_t>(c10::elementSize(t)); }

// Math dtype for a bucket dtype: float64 stays, everything else is float32.
at::ScalarType compute_dtype(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// a: contiguous (rows x cols) on the bucket's device; `generic` picks the
// libtorch version (any device) over the loop (host pointers).
void orthogonalize(at::Tensor& a, bool generic) {
  if (generic) return orthogonalize_columns_generic(a);
  if (a.scalar_type() == at::kDouble)
    orthogonalize_columns(a.data_ptr<double>(), a.size(0), a.size(1));
  else
    orthogonalize_columns(a.data_ptr<float>(), a.size(0), a.size(1));
}

// Fill `q` (contiguous, any device) with N(0, 1) from `gen` (a CPU
// generator), drawn on the host: in place for the CPU path; `generic`: into
// a host tensor, then copied (the same values).
void fresh_q(at::Generator& gen, at::Tensor q, bool generic) {
  if (!generic) {
    q.normal_(0.0, 1.0, gen);
    return;
  }
  // The CPU generator draws on the host (the values the CPU path draws in
  // place), then one copy to the device;
  // a device generator would make the draws and the checkpointed state
  // depend on the device.
  at::Tensor h = at::empty(q.sizes(), q.options().device(at::kCPU));
  h.normal_(0.0, 1.0, gen);
  q.copy_(h);
}

}  // namespace

BucketPlan plan_bucket(const dopt_bucket& bucket, const PowerSgdOptions& opts) {
  if (!bucket.flat) throw bad("bucket " + std::to_string(bucket.index) + " has no flat buffer");
  if (bucket.num_entries && !bucket.entries)
    throw bad("bucket " + std::to_string(bucket.index) + " has no entries");
  BucketPlan plan;
  plan.flat_numel = sdk::dl_numel(*bucket.flat);
  std::vector<size_t> uncompressed;
  for (size_t i = 0; i < bucket.num_entries; ++i) {
    const dopt_bucket_entry& e = bucket.entries[i];
    const std::string what = "bucket " + std::to_string(bucket.index) + " entry " +
                             std::to_string(i) +
                             (e.name ? " ('" + std::string(e.name) + "')" : std::string());
    if (e.offset > plan.flat_numel || e.numel > plan.flat_numel - e.offset)
      throw bad(what + ": elements [" + std::to_string(e.offset) + ", +" + std::to_string(e.numel) +
                ") exceed the flat buffer of " + std::to_string(plan.flat_numel));
    if (e.ndim < 0 || (e.ndim > 0 && !e.shape)) throw bad(what + ": bad shape");
    size_t shape_numel = 1;
    for (int32_t d = 0; d < e.ndim; ++d) {
      if (e.shape[d] < 0) throw bad(what + ": negative dimension");
      shape_numel *= static_cast<size_t>(e.shape[d]);
    }
    if (shape_numel != e.numel)
      throw bad(what + ": shape holds " + std::to_string(shape_numel) + " elements, numel is " +
                std::to_string(e.numel));
    EntryPlan p;
    p.name = e.name ? std::string(e.name)
                    : "bucket" + std::to_string(bucket.index) + ".entry" + std::to_string(i);
    p.shape.assign(e.shape, e.shape + e.ndim);
    p.offset = e.offset;
    p.numel = e.numel;
    if (e.ndim >= 2 && e.numel > 0) {
      // Trailing dims folded: a conv weight (out, in, kh, kw) is out x (in kh kw).
      p.n = e.shape[0];
      p.m = static_cast<int64_t>(e.numel) / p.n;
      p.r = std::min({opts.rank, p.n, p.m});
      // PyTorch's _should_compress: compressed size x rate < uncompressed size.
      p.compressed = static_cast<double>((p.n + p.m) * p.r) * opts.min_compression_rate <
                     static_cast<double>(p.n) * static_cast<double>(p.m);
    }
    if (p.compressed) {
      p.p_off = plan.p_numel;
      p.q_off = plan.q_numel;
      p.e_off = plan.e_numel;
      plan.p_numel += static_cast<size_t>(p.n * p.r);
      plan.q_numel += static_cast<size_t>(p.m * p.r);
      plan.e_numel += p.numel;
      ++plan.num_compressed;
    } else {
      uncompressed.push_back(plan.entries.size());
    }
    plan.entries.push_back(p);
  }
  plan.p_compressed_numel = plan.p_numel;
  for (size_t k : uncompressed) {
    plan.entries[k].p_off = plan.p_numel;
    plan.p_numel += plan.entries[k].numel;
  }
  return plan;
}

// ---------------------------------------------------------------------------

struct PowerSgdReducer::BucketState {
  int32_t index = 0;
  BucketPlan plan;
  at::Device device{at::kCPU};      // the bucket's (and p, q, e's) device
  bool generic = false;             // libtorch orthogonalisation (Kernels)
  at::ScalarType cdt = at::kFloat;  // compute dtype of p, q, e (from the bucket dtype)
  int64_t steps = 0;                // reductions done (plain ones included)
  bool have_q = false;              // Q's hold last step's values (warm start)
  at::Tensor p, q, e;               // packed P(+uncompressed), Q's, residuals (compute dtype)
};

struct PowerSgdReducer::Rng {
  at::Generator gen;
};

struct PowerSgdReducer::Job {
  BucketState* state = nullptr;
  at::Tensor flat;  // aliases the host's bucket buffer
  std::shared_ptr<sdk::Completion> done;
};

PowerSgdReducer::PowerSgdReducer(const dopt_create_args& args, dopt_comm_ref comm,
                                 const dopt_bucket* buckets, size_t num_buckets)
    : comm_(comm), rank_(args.rank), world_size_(args.world_size) {
  if (!comm.vt || !comm.comm) throw bad("no communicator");
  if (comm_.world_size() != args.world_size)
    throw bad("communicator has " + std::to_string(comm_.world_size()) + " ranks, job has " +
              std::to_string(args.world_size));
  sdk::OptionsView o(args.options);
  opts_.rank = o.get_int("rank");
  // reuse_query is mlbench's name for warm_start; either one set to false turns it off.
  opts_.warm_start = o.get_bool("warm_start") && o.get_bool("reuse_query");
  opts_.start_iter = o.get_int("start_iter");
  opts_.min_compression_rate = o.get_double("min_compression_rate");
  opts_.seed = static_cast<uint64_t>(o.get_int("seed"));
  const std::string kernels = o.get_string("kernels");
  if (kernels == "cpu")
    opts_.kernels = Kernels::kCpu;
  else if (kernels == "generic")
    opts_.kernels = Kernels::kGeneric;
  else if (kernels != "auto")
    throw bad("kernels must be auto, cpu or generic, got '" + kernels + "'");
  if (opts_.rank < 1) throw bad("rank must be >= 1");
  if (opts_.start_iter < 0) throw bad("start_iter must be >= 0");
  if (!(opts_.min_compression_rate >= 0)) throw bad("min_compression_rate must be >= 0");
  rng_ = std::make_unique<Rng>();
  rng_->gen = at::make_generator<at::CPUGeneratorImpl>(opts_.seed);

  for (size_t b = 0; b < num_buckets; ++b) {
    BucketState& s = state_for(buckets[b]);
    if (args.rank == 0) {
      size_t unc = s.plan.entries.size() - s.plan.num_compressed;
      const double sent = static_cast<double>(s.plan.p_numel + s.plan.q_numel);
      char line[256];
      std::snprintf(line, sizeof line,
                    "bucket %d: %zu matri%s compressed at rank %lld, %zu tensor(s) uncompressed; "
                    "%.0f values per step instead of %zu (%.1fx)",
                    s.index, s.plan.num_compressed, s.plan.num_compressed == 1 ? "x" : "ces",
                    static_cast<long long>(opts_.rank), unc, sent, s.plan.flat_numel,
                    sent > 0 ? static_cast<double>(s.plan.flat_numel) / sent : 0.0);
      sdk::log_info(kWho, line);
    }
  }
}

PowerSgdReducer::BucketState& PowerSgdReducer::state_for(const dopt_bucket& bucket) {
  if (bucket.index < 0) throw bad("negative bucket index " + std::to_string(bucket.index));
  std::lock_guard<std::mutex> lk(states_mu_);
  const size_t i = static_cast<size_t>(bucket.index);
  if (i >= states_.size()) states_.resize(i + 1);
  if (!states_[i]) {
    auto s = std::make_unique<BucketState>();
    s->index = bucket.index;
    s->plan = plan_bucket(bucket, opts_);
    if (bucket.flat && bucket.flat->dtype.code == kDLFloat && bucket.flat->dtype.bits == 64)
      s->cdt = at::kDouble;
    const int32_t dev = bucket.flat->device.device_type;
    if (dev != kDLCPU && dev != kDLCUDA)
      throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                       "powersgd: bucket " + std::to_string(bucket.index) +
                           ": only kDLCPU and kDLCUDA buckets are supported, not device type " +
                           std::to_string(dev));
    if (dev != kDLCPU && opts_.kernels == Kernels::kCpu)
      throw sdk::Error(DOPT_ERR_UNSUPPORTED,
                       "powersgd: bucket " + std::to_string(bucket.index) +
                           " is device memory: kernels: cpu orthogonalises host memory only (use "
                           "kernels: auto or generic)");
    s->device = sdk::to_device(bucket.flat->device);
    s->generic =
        opts_.kernels == Kernels::kGeneric || (opts_.kernels == Kernels::kAuto && dev != kDLCPU);
    states_[i] = std::move(s);
  } else {
    // Same index, same layout: the state (residuals, Q's) belongs to it.
    const BucketPlan& p = states_[i]->plan;
    bool same = bucket.flat && sdk::dl_numel(*bucket.flat) == p.flat_numel &&
                bucket.num_entries == p.entries.size() &&
                sdk::to_device(bucket.flat->device) == states_[i]->device;
    for (size_t k = 0; same && k < bucket.num_entries; ++k)
      same = bucket.entries[k].offset == p.entries[k].offset &&
             bucket.entries[k].numel == p.entries[k].numel;
    if (!same)
      throw bad("bucket " + std::to_string(bucket.index) +
                " changed its layout since it was first seen");
  }
  return *states_[i];
}

std::unique_ptr<sdk::Request> PowerSgdReducer::reduce(const dopt_bucket& bucket) {
  if (!bucket.flat) throw bad("bucket without a flat buffer");
  const DLTensor& dl = *bucket.flat;
  if (dl.ndim != 1 || (dl.strides && dl.strides[0] != 1))
    throw bad("the bucket's flat buffer must be 1-D contiguous");
  auto job = std::make_shared<Job>();
  job->flat = sdk::as_tensor(dl);  // throws UNSUPPORTED for other dtypes and devices
  const auto st = job->flat.scalar_type();
  if (st != at::kFloat && st != at::kDouble && st != at::kHalf && st != at::kBFloat16)
    throw sdk::Error(DOPT_ERR_UNSUPPORTED, std::string("powersgd: bucket dtype ") +
                                               c10::toString(st) + " is not floating point");
  job->state = &state_for(bucket);
  job->done = std::make_shared<sdk::Completion>();
  auto req = std::make_unique<sdk::CompletionRequest>(job->done);
  worker_.submit([this, job] { run_job(*job); }, job->done,
                 "bucket " + std::to_string(job->state->index));
  return req;
}

void PowerSgdReducer::run_job(Job& job) {
  BucketState& s = *job.state;
  const BucketPlan& plan = s.plan;
  at::Tensor& flat = job.flat;
  if (static_cast<size_t>(flat.numel()) != plan.flat_numel) throw bad("flat buffer length changed");

  if (s.steps < opts_.start_iter) {
    // Plain average of the whole bucket in place, like `mean`; no residual yet
    // (PyTorch's hook starts error feedback with compression too).
    sdk::DLView v(flat);
    comm_.allreduce(*v.get(), *v.get(), DOPT_REDUCE_AVG).wait();
    bytes_sent_ +=
        sdk::ring_allreduce_bytes(plan.flat_numel * dtype_bytes(flat.scalar_type()), world_size_);
    ++s.steps;
    return;
  }

  const at::ScalarType cdt = compute_dtype(flat.scalar_type());
  const auto opt = at::TensorOptions().dtype(cdt).device(s.device);
  const size_t esz = dtype_bytes(cdt);
  // Half-precision buckets: work on a float32 copy, written back at the end.
  at::Tensor work = flat.scalar_type() == cdt ? flat : flat.to(cdt);
  if (!s.p.defined()) {
    s.p = at::empty({static_cast<int64_t>(plan.p_numel)}, opt);
    s.q = at::empty({static_cast<int64_t>(plan.q_numel)}, opt);
    s.e = at::zeros({static_cast<int64_t>(plan.e_numel)}, opt);
  }
  if (!s.have_q || !opts_.warm_start) {
    fresh_q(rng_->gen, s.q, s.generic);
    s.have_q = true;
  }

  struct Mats {
    at::Tensor m, e, p, q;
  };
  std::vector<Mats> mats;
  mats.reserve(plan.num_compressed);
  for (const EntryPlan& ep : plan.entries) {
    const auto nn = static_cast<int64_t>(ep.numel);
    if (!ep.compressed) {
      s.p.narrow(0, static_cast<int64_t>(ep.p_off), nn)
          .copy_(work.narrow(0, static_cast<int64_t>(ep.offset), nn));
      continue;
    }
    Mats x;
    x.m = work.narrow(0, static_cast<int64_t>(ep.offset), nn).view({ep.n, ep.m});
    x.e = s.e.narrow(0, static_cast<int64_t>(ep.e_off), nn).view({ep.n, ep.m});
    x.p = s.p.narrow(0, static_cast<int64_t>(ep.p_off), ep.n * ep.r).view({ep.n, ep.r});
    x.q = s.q.narrow(0, static_cast<int64_t>(ep.q_off), ep.m * ep.r).view({ep.m, ep.r});
    x.m.add_(x.e);   // error feedback: compress gradient + last residual
    x.e.copy_(x.m);  // becomes M - P Q^T below
    // An orthonormal Q (as PyTorch's hook does) keeps a reused Q well
    // conditioned; P = M Q is the power-iteration step.
    orthogonalize(x.q, s.generic);
    at::mm_out(x.p, x.m, x.q);
    mats.push_back(std::move(x));
  }

  // One allreduce: every P and every uncompressed value of the bucket.
  if (plan.p_numel > 0) {
    sdk::DLView v(s.p);
    comm_.allreduce(*v.get(), *v.get(), DOPT_REDUCE_AVG).wait();
    bytes_sent_ += sdk::ring_allreduce_bytes(plan.p_numel * esz, world_size_);
  }
  for (const EntryPlan& ep : plan.entries)
    if (!ep.compressed) {
      const auto nn = static_cast<int64_t>(ep.numel);
      work.narrow(0, static_cast<int64_t>(ep.offset), nn)
          .copy_(s.p.narrow(0, static_cast<int64_t>(ep.p_off), nn));
    }

  if (!mats.empty()) {
    for (Mats& x : mats) {
      orthogonalize(x.p, s.generic);  // bit-identical on every rank (same allreduced P)
      at::mm_out(x.q, x.m.t(), x.p);  // Q = M^T P
    }
    at::Tensor qs = s.q.narrow(0, 0, static_cast<int64_t>(plan.q_numel));
    sdk::DLView v(qs);
    comm_.allreduce(*v.get(), *v.get(), DOPT_REDUCE_AVG).wait();
    bytes_sent_ += sdk::ring_allreduce_bytes(plan.q_numel * esz, world_size_);
    for (Mats& x : mats) {
      at::mm_out(x.m, x.p, x.q.t());  // P Q^T: rank-r approximation of the average
      x.e.sub_(x.m);                  // residual M - P Q^T, kept for the next step
    }
  }
  if (!work.is_same(flat)) {
    for (const EntryPlan& ep : plan.entries) {
      const auto nn = static_cast<int64_t>(ep.numel);
      flat.narrow(0, static_cast<int64_t>(ep.offset), nn)
          .copy_(work.narrow(0, static_cast<int64_t>(ep.offset), nn));
    }
  }
  ++s.steps;
}

// ---------------------------------------------------------------------------
// Checkpoints

namespace {

at::Tensor scalar_i64(int64_t v) { return at::full({}, v, at::TensorOptions().dtype(at::kLong)); }

}  // namespace

void PowerSgdReducer::save_state(sdk::StateWriter& w) {
  std::lock_guard<std::mutex> lk(states_mu_);
  if (rank_ == 0) {
    // Every rank holds the same generator state (same draws in the same
    // order), so one copy is the whole state.
    at::Tensor rng;
    {
      std::lock_guard<std::mutex> g(rng_->gen.mutex());
      rng = rng_->gen.get_state();
    }
    sdk::put_whole(w, "powersgd/rng", rng);
  }
  for (const auto& sp : states_) {
    if (!sp) continue;
    const BucketState& s = *sp;
    if (rank_ == 0)
      for (const EntryPlan& ep : s.plan.entries)
        sdk::put_whole(w, "powersgd/step/" + ep.name, scalar_i64(s.steps));
    if (!s.e.defined()) continue;  // not compressed yet: no residual, no Q
    for (const EntryPlan& ep : s.plan.entries) {
      if (!ep.compressed) continue;
      const auto nn = static_cast<int64_t>(ep.numel);
      sdk::put_local(w, "error_feedback/" + ep.name,
                     s.e.narrow(0, static_cast<int64_t>(ep.e_off), nn).view(ep.shape));
      if (rank_ == 0 && s.have_q)
        sdk::put_whole(
            w, "powersgd/q/" + ep.name,
            s.q.narrow(0, static_cast<int64_t>(ep.q_off), ep.m * ep.r).view({ep.m, ep.r}));
    }
  }
}

namespace {

// The steps of PowerSgdReducer::load_state for one bucket; each appends what
// it warns of to `warnings` (rank 0 logs them once all buckets are read).

// The bucket's reduction count: the same for all its parameters unless the
// bucket layout changed; then the largest (compression stays on). Counts the
// parameters without a saved count in `missing_steps`.
int64_t load_bucket_steps(const sdk::StateReader& r, const BucketPlan& plan,
                          const std::string& bucket, size_t& missing_steps,
                          std::vector<std::string>& warnings) {
  int64_t steps = 0;
  bool any = false, differ = false;
  for (const EntryPlan& ep : plan.entries) {
    const std::string key = "powersgd/step/" + ep.name;
    if (!r.find(key)) {
      ++missing_steps;
      continue;
    }
    const int64_t v = sdk::read_range(r, key, 0, 1, at::kLong).item<int64_t>();
    if (v < 0) throw bad("checkpoint state '" + key + "' is negative");
    differ = differ || (any && v != steps);
    steps = any ? std::max(steps, v) : v;
    any = true;
  }
  if (differ)
    warnings.push_back(bucket +
                       ": its parameters were saved with different step counts (the bucket "
                       "layout changed); continuing from the largest, " +
                       std::to_string(steps));
  return steps;
}

// Whether the checkpoint holds a residual or Q of any of the bucket's
// compressed matrices (those of matrices no longer compressed are dropped).
bool has_compression_state(const sdk::StateReader& r, const BucketPlan& plan,
                           std::vector<std::string>& warnings) {
  bool have_state = false;
  for (const EntryPlan& ep : plan.entries) {
    if (r.find("error_feedback/" + ep.name) || r.find("powersgd/q/" + ep.name)) {
      if (ep.compressed)
        have_state = true;
      else
        warnings.push_back("'" + ep.name +
                           "' is no longer compressed (rank or min_compression_rate changed): "
                           "its saved residual / Q are dropped");
    }
  }
  return have_state;
}

// One compressed matrix's residual (into `e`, its slice of the bucket's
// residual; counted in `residuals`) and Q (into `q`, or a fresh random one
// drawn from `gen` if missing or of another shape).
void load_entry(const sdk::StateReader& r, const EntryPlan& ep, at::Tensor e, at::Tensor q,
                at::Generator& gen, bool generic, size_t& residuals,
                std::vector<std::string>& warnings) {
  const auto nn = static_cast<int64_t>(ep.numel);
  const std::string ekey = "error_feedback/" + ep.name, qkey = "powersgd/q/" + ep.name;
  sdk::StateInfo info;
  if (r.find(ekey, &info)) {
    if (info.numel() != nn)
      throw bad("checkpoint state '" + ekey + "' has " + std::to_string(info.numel()) +
                " elements, parameter '" + ep.name + "' has " + std::to_string(nn));
    sdk::read_into(r, ekey, 0, e);
    ++residuals;
  } else {
    warnings.push_back("checkpoint has no '" + ekey + "': its residual starts from zero");
  }
  const bool q_fits = r.find(qkey, &info) && info.shape == std::vector<int64_t>{ep.m, ep.r};
  if (q_fits) {
    sdk::read_into(r, qkey, 0, q);
  } else {
    if (r.find(qkey))
      warnings.push_back("'" + qkey + "' was saved with another shape than " +
                         std::to_string(ep.m) + " x " + std::to_string(ep.r) +
                         " (the rank option changed): a fresh random Q replaces it");
    fresh_q(gen, q, generic);
  }
}

}  // namespace

void PowerSgdReducer::load_state(const sdk::StateReader& r) {
  std::lock_guard<std::mutex> lk(states_mu_);
  std::vector<std::string> warnings;
  if (r.find("powersgd/rng")) {
    at::Tensor st = sdk::read_whole(r, "powersgd/rng").to(at::kByte).contiguous();
    std::lock_guard<std::mutex> g(rng_->gen.mutex());
    try {
      rng_->gen.set_state(st);
    } catch (const c10::Error& e) {
      throw bad("checkpoint state 'powersgd/rng' is not a CPU generator state: " +
                std::string(e.what_without_backtrace()));
    }
  } else {
    warnings.push_back("checkpoint has no 'powersgd/rng': fresh Q's are drawn from seed " +
                       std::to_string(opts_.seed) + " again");
  }
  size_t missing_steps = 0, residuals = 0;
  for (auto& sp : states_) {
    if (!sp) continue;
    BucketState& s = *sp;
    const BucketPlan& plan = s.plan;
    s.steps =
        load_bucket_steps(r, plan, "bucket " + std::to_string(s.index), missing_steps, warnings);
    // The buffers exist once a bucket has compressed; a checkpoint with any
    // of its matrices' state brings them back.
    if (!has_compression_state(r, plan, warnings)) {
      s.p = s.q = s.e = at::Tensor();
      s.have_q = false;
      continue;
    }
    const auto opt = at::TensorOptions().dtype(s.cdt).device(s.device);
    s.p = at::empty({static_cast<int64_t>(plan.p_numel)}, opt);
    s.q = at::empty({static_cast<int64_t>(plan.q_numel)}, opt);
    s.e = at::zeros({static_cast<int64_t>(plan.e_numel)}, opt);
    for (const EntryPlan& ep : plan.entries)
      if (ep.compressed)
        load_entry(r, ep,
                   s.e.narrow(0, static_cast<int64_t>(ep.e_off), static_cast<int64_t>(ep.numel)),
                   s.q.narrow(0, static_cast<int64_t>(ep.q_off), ep.m * ep.r), rng_->gen, s.generic,
                   residuals, warnings);
    s.have_q = true;
  }
  if (missing_steps > 0)
    warnings.push_back("checkpoint has no powersgd/step for " + std::to_string(missing_steps) +
                       " parameter(s): their buckets start over (start_iter plain steps)");
  if (residuals > 0 && r.saved_world_size() != world_size_)
    warnings.push_back("checkpoint was saved by " + std::to_string(r.saved_world_size()) +
                       " ranks, loading into " + std::to_string(world_size_) +
                       ": every rank's error-feedback residual is the mean of the saved ranks'");
  if (rank_ == 0)
    for (const std::string& m : warnings) sdk::log_warn(kWho, m);
}

}  // namespace distopt::plugins::powersgd
