#include "randomk_reducer.hpp"

#include <algorithm>
#include <numeric>

#include "distopt/sdk/base/tensor.hpp"

namespace distopt::plugins::compress {
namespace {

struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (Lemire's multiply-shift; bias < n / 2^64).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};

}  // namespace

std::vector<uint32_t> random_subset(uint64_t seed, uint64_t bucket, uint64_t step, uint64_t entry,
                                    size_t n, size_t k) {
  SplitMix64 g{seed};
  for (uint64_t v : {bucket, step, entry}) g.s = g.next() ^ v;
  std::vector<uint32_t> out;
  if (2 * k > n) {  // dense: partial Fisher-Yates
    std::vector<uint32_t> a(n);
    std::iota(a.begin(), a.end(), 0u);
    for (size_t j = 0; j < k; ++j) std::swap(a[j], a[j + g.below(n - j)]);
    out.assign(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(k));
  } else {  // sparse: rejection (expected < 2 draws per index)
    std::vector<uint8_t> taken(n, 0);
    out.reserve(k);
    while (out.size() < k) {
      auto i = static_cast<uint32_t>(g.below(n));
      if (!taken[i]) {
        taken[i] = 1;
        out.push_back(i);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

RandomkReducer::RandomkReducer(const dopt_create_args& args, dopt_comm_ref comm,
                               const dopt_bucket* buckets, size_t num_buckets)
    : CompressReducer("randomk", args, comm, buckets, num_buckets),
      opts_(SparseOptions::read("randomk", args.options)),
      error_feedback_(opts_.error_feedback),
      momentum_(opts_.momentum, opts_.momentum_masking, layouts_),
      seed_(static_cast<uint64_t>(sdk::OptionsView(args.options).get_int("seed"))),
      state_(layouts_.size()) {
  std::vector<at::Tensor> zeros;
  if (error_feedback_) zeros = zero_buffers();
  for (size_t b = 0; b < layouts_.size(); ++b) {
    size_t k = 0;
    for (const Slice& e : layouts_[b].entries) k += opts_.keep(e.numel);
    if (!layouts_[b].generic) state_[b].values.resize(k);
    state_[b].index.resize(k);
    if (error_feedback_) state_[b].residual = zeros[b];
  }
}

std::vector<at::Tensor> RandomkReducer::residuals() {
  std::vector<at::Tensor> out;
  for (State& s : state_) out.push_back(s.residual);
  return out;
}

void RandomkReducer::save_state(sdk::StateWriter& w) {
  if (rank_ == 0) {
    for (size_t b = 0; b < layouts_.size(); ++b) {
      int64_t step = static_cast<int64_t>(state_[b].step);
      DLTensor t{};
      t.data = &step;
      t.device = {kDLCPU, 0};
      t.ndim = 0;
      t.dtype = DLDataType{kDLInt, 64, 1};
      for (const Slice& e : layouts_[b].entries) w.put_sharded("randomk/step/" + e.name, t, 0, {});
    }
  }
  save_feedback_state(w, residuals(), momentum_);
}

void RandomkReducer::load_state(const sdk::StateReader& r) {
  size_t missing = 0;
  for (size_t b = 0; b < layouts_.size(); ++b) {
    int64_t step = 0;
    bool any = false, differ = false;
    for (const Slice& e : layouts_[b].entries) {
      const std::string key = "randomk/step/" + e.name;
      if (!r.find(key)) {
        ++missing;
        continue;
      }
      int64_t v = 0, one = 0;
      DLTensor t = host_tensor(&v, 1, DLDataType{kDLInt, 64, 1}, &one);
      r.read(key, 0, t);
      if (v < 0)
        throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                         "randomk: checkpoint state '" + key + "' is negative");
      differ = differ || (any && v != step);
      step = any ? std::max(step, v) : v;
      any = true;
    }
    if (differ && rank_ == 0)
      sdk::log_warn(component_,
                    "bucket " + std::to_string(b) +
                        ": its parameters were saved with different reduction counts (the "
                        "bucket layout changed); continuing from the largest, " +
                        std::to_string(step));
    state_[b].step = static_cast<uint64_t>(step);
  }
  if (missing > 0 && rank_ == 0)
    sdk::log_warn(component_, "checkpoint has no randomk/step for " + std::to_string(missing) +
                                  " parameter(s); their buckets' index draws restart from step 0");
  load_feedback_state(r, residuals(), momentum_);
}

std::unique_ptr<sdk::Request> RandomkReducer::reduce(const dopt_bucket& bucket) {
  const BucketLayout& l = layout_of(component_, layouts_, bucket);
  const size_t b = static_cast<size_t>(bucket.index);
  State& s = state_[b];
  if (l.generic) return reduce_generic(b, bucket);
  load_float(*bucket.flat, s.work);
  size_t j = 0;
  for (size_t t = 0; t < l.entries.size(); ++t) {
    const Slice& e = l.entries[t];
    float* p = s.work.data() + e.offset;
    float* res = error_feedback_ ? s.residual.data_ptr<float>() + e.offset : nullptr;
    momentum_.accumulate(b, e, p);
    if (res)
      for (size_t i = 0; i < e.numel; ++i) p[i] += res[i];
    for (uint32_t i : random_subset(seed_, b, s.step, t, e.numel, opts_.keep(e.numel))) {
      s.index[j] = static_cast<uint32_t>(e.offset + i);
      s.values[j++] = p[i];
      p[i] = 0.0f;  // p becomes what was not sent
      momentum_.sent(b, e.offset + i);
    }
    if (res) std::copy(p, p + e.numel, res);
  }
  ++s.step;
  s.dl = host_tensor(s.values.data(), static_cast<int64_t>(s.values.size()), kF32, &s.shape);
  auto handle = comm_.allreduce(s.dl, s.dl, DOPT_REDUCE_AVG);
  count_sent(ring_allreduce_bytes(4 * static_cast<uint64_t>(s.values.size()), world_size_));
  DLTensor* flat = bucket.flat;
  return std::make_unique<StagedRequest>(std::move(handle), [&s, flat] {
    std::fill(s.work.begin(), s.work.end(), 0.0f);
    for (size_t q = 0; q < s.index.size(); ++q) s.work[s.index[q]] = s.values[q];
    store_float(s.work, *flat);
  });
}

std::unique_ptr<sdk::Request> RandomkReducer::reduce_generic(size_t b, const dopt_bucket& bucket) {
  const BucketLayout& l = layouts_[b];
  State& s = state_[b];
  // The draws: on the host, from (seed, bucket, step, entry) only.
  std::vector<int64_t> idx;
  idx.reserve(s.index.size());
  for (size_t t = 0; t < l.entries.size(); ++t) {
    const Slice& e = l.entries[t];
    for (uint32_t i : random_subset(seed_, b, s.step, t, e.numel, opts_.keep(e.numel)))
      idx.push_back(static_cast<int64_t>(e.offset + i));
  }
  ++s.step;
  at::Tensor sel = at::tensor(idx, at::kLong).to(l.device);
  at::Tensor p = load_work(*bucket.flat, l, /*zero_padding=*/true);
  momentum_.accumulate(b, p);
  if (error_feedback_) p.add_(s.residual);
  s.values_view = sdk::DLView(p.index_select(0, sel));
  momentum_.sent(b, sel);
  if (error_feedback_) s.residual.copy_(p.index_fill_(0, sel, 0.0));  // what was not sent
  auto handle = comm_.allreduce(*s.values_view.get(), *s.values_view.get(), DOPT_REDUCE_AVG);
  count_sent(ring_allreduce_bytes(4 * static_cast<uint64_t>(idx.size()), world_size_));
  const DLTensor* flat = bucket.flat;
  const int64_t length = static_cast<int64_t>(l.length);
  return std::make_unique<StagedRequest>(std::move(handle), [&s, flat, sel, length] {
    at::Tensor work = at::zeros({length}, s.values_view.tensor().options());
    work.index_copy_(0, sel, s.values_view.tensor());
    store_work(work, *flat);
    s.values_view = sdk::DLView();
  });
}

}  // namespace distopt::plugins::compress
