#include "topk_reducer.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "distopt/sdk/base/tensor.hpp"

namespace distopt::plugins::compress {
namespace {

// The k-th largest |p_i| (exact). A strided sample first gives a lower bound
// that about 2k elements clear; selecting among those candidates only is
// ~10x cheaper than std::nth_element over all n for k = 1% of n. When the
// bound lets fewer than k through (possible for adversarial orderings) the
// full selection runs instead.
float kth_largest_abs(const float* p, size_t n, size_t k, std::vector<float>& scratch) {
  auto select = [&](size_t count) {
    std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1),
                     scratch.begin() + static_cast<std::ptrdiff_t>(count), std::greater<float>());
    return scratch[k - 1];
  };
  const size_t stride = n / 4096;
  if (stride >= 4) {
    scratch.clear();
    for (size_t i = 0; i < n; i += stride) scratch.push_back(std::fabs(p[i]));
    const size_t ks = std::min(scratch.size(), 2 * k / stride + 8);
    std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(ks - 1),
                     scratch.end(), std::greater<float>());
    const float bound = scratch[ks - 1];
    scratch.clear();
    for (size_t i = 0; i < n; ++i)
      if (std::fabs(p[i]) >= bound) scratch.push_back(std::fabs(p[i]));
    if (scratch.size() >= k) return select(scratch.size());
  }
  scratch.resize(n);
  for (size_t i = 0; i < n; ++i) scratch[i] = std::fabs(p[i]);
  return select(n);
}

}  // namespace

TopkReducer::TopkReducer(const dopt_create_args& args, dopt_comm_ref comm,
                         const dopt_bucket* buckets, size_t num_buckets)
    : CompressReducer("topk", args, comm, buckets, num_buckets),
      opts_(SparseOptions::read("topk", args.options)),
      error_feedback_(opts_.error_feedback),
      momentum_(opts_.momentum, opts_.momentum_masking, layouts_),
      state_(layouts_.size()) {
  static_assert(sizeof(Pair) == 8, "pairs travel as 8 bytes");
  std::vector<at::Tensor> zeros;
  if (error_feedback_) zeros = zero_buffers();
  for (size_t b = 0; b < layouts_.size(); ++b) {
    size_t k = 0;
    for (const Slice& e : layouts_[b].entries) k += opts_.keep(e.numel);
    state_[b].k = k;
    if (!layouts_[b].generic) {
      state_[b].send.resize(k);
      state_[b].recv.resize(k * static_cast<size_t>(world_size_));
    }
    if (error_feedback_) state_[b].residual = zeros[b];
  }
}

std::unique_ptr<sdk::Request> TopkReducer::reduce(const dopt_bucket& bucket) {
  const BucketLayout& l = layout_of(component_, layouts_, bucket);
  const size_t b = static_cast<size_t>(bucket.index);
  State& s = state_[b];
  if (l.generic) return reduce_generic(b, bucket);
  load_float(*bucket.flat, s.work);
  Pair* out = s.send.data();
  for (const Slice& e : l.entries) {
    float* p = s.work.data() + e.offset;
    float* res = error_feedback_ ? s.residual.data_ptr<float>() + e.offset : nullptr;
    momentum_.accumulate(b, e, p);
    if (res)
      for (size_t i = 0; i < e.numel; ++i) p[i] += res[i];
    const size_t k = opts_.keep(e.numel);
    // Threshold = the k-th largest |p|; take everything above it, then ties
    // at it in index order until k are taken.
    const float thr = k < e.numel ? kth_largest_abs(p, e.numel, k, s.scratch) : 0.0f;
    size_t above = 0;
    if (k < e.numel)
      for (size_t i = 0; i < e.numel; ++i) above += std::fabs(p[i]) > thr;
    size_t ties = k - above, taken = 0;
    for (size_t i = 0; i < e.numel && taken < k; ++i) {
      const float a = std::fabs(p[i]);
      bool take = k == e.numel || a > thr;
      if (!take && a == thr && ties > 0) {
        take = true;
        --ties;
      }
      if (!take) continue;
      *out++ = {static_cast<uint32_t>(e.offset + i), p[i]};
      momentum_.sent(b, e.offset + i);
      ++taken;
      if (res) p[i] = 0.0f;  // p becomes what was not sent
    }
    if (res) std::copy(p, p + e.numel, res);
  }
  s.send_dl =
      host_tensor(s.send.data(), static_cast<int64_t>(8 * s.send.size()), kU8, &s.send_shape);
  s.recv_dl =
      host_tensor(s.recv.data(), static_cast<int64_t>(8 * s.recv.size()), kU8, &s.recv_shape);
  auto handle = comm_.allgather(s.send_dl, s.recv_dl);
  count_sent(allgather_bytes(8 * static_cast<uint64_t>(s.send.size()), world_size_));
  DLTensor* flat = bucket.flat;
  return std::make_unique<StagedRequest>(std::move(handle), [this, b, flat] { finish(b, flat); });
}

std::vector<at::Tensor> TopkReducer::residuals() {
  std::vector<at::Tensor> out;
  for (State& s : state_) out.push_back(s.residual);
  return out;
}

void TopkReducer::save_state(sdk::StateWriter& w) {
  save_feedback_state(w, residuals(), momentum_);
}

void TopkReducer::load_state(const sdk::StateReader& r) {
  load_feedback_state(r, residuals(), momentum_);
}

void TopkReducer::finish(size_t b, DLTensor* flat) {
  State& s = state_[b];
  std::fill(s.work.begin(), s.work.end(), 0.0f);
  for (const Pair& q : s.recv) {  // rank order
    if (q.index >= s.work.size())
      throw sdk::Error(DOPT_ERR_COMM, "topk: a peer sent index " + std::to_string(q.index) +
                                          " past bucket " + std::to_string(b) + "'s " +
                                          std::to_string(s.work.size()) + " elements");
    s.work[q.index] += q.value;
  }
  const float w = static_cast<float>(world_size_);
  for (float& v : s.work) v /= w;
  store_float(s.work, *flat);
}

// The generic path: the CPU kernels' selection and sums as libtorch ops.
std::unique_ptr<sdk::Request> TopkReducer::reduce_generic(size_t b, const dopt_bucket& bucket) {
  const BucketLayout& l = layouts_[b];
  State& s = state_[b];
  const auto lopt = at::TensorOptions().dtype(at::kLong).device(l.device);
  at::Tensor p = load_work(*bucket.flat, l, /*zero_padding=*/true);
  momentum_.accumulate(b, p);
  if (error_feedback_) p.add_(s.residual);
  std::vector<at::Tensor> picked;
  for (const Slice& e : l.entries) {
    const auto off = static_cast<int64_t>(e.offset), n = static_cast<int64_t>(e.numel);
    const auto k = static_cast<int64_t>(opts_.keep(e.numel));
    if (k == n) {
      picked.push_back(at::arange(off, off + n, lopt));
      continue;
    }
    at::Tensor a = p.narrow(0, off, n).abs();
    at::Tensor thr = std::get<0>(a.topk(k, 0, /*largest=*/true, /*sorted=*/false)).min();
    // Everything above the k-th largest, then ties at it in index order.
    at::Tensor above = a.gt(thr), tie = a.eq(thr);
    at::Tensor take = above.logical_or(tie.logical_and(tie.cumsum(0).add(above.sum()).le(k)));
    // Exactly k taken: their ascending positions, without a host read of the count
    // (untaken elements all go to slot k, dropped).
    at::Tensor pos = at::where(take, take.cumsum(0).sub(1), at::full({}, k, lopt));
    picked.push_back(
        at::empty({k + 1}, lopt).scatter_(0, pos, at::arange(n, lopt)).narrow(0, 0, k).add(off));
  }
  at::Tensor sel = picked.empty() ? at::empty({0}, lopt) : at::cat(picked);
  at::Tensor values = p.index_select(0, sel);
  momentum_.sent(b, sel);
  if (error_feedback_) s.residual.copy_(p.index_fill_(0, sel, 0.0));  // what was not sent
  // (uint32 index, float32 value) pairs, little-endian, as the CPU kernels' Pair.
  at::Tensor pairs = at::stack({sel.to(at::kInt), values.view(at::kInt)}, 1);
  s.send_view = sdk::DLView(pairs.view({-1}).view(at::kByte));
  s.recv_view =
      sdk::DLView(at::empty({static_cast<int64_t>(8 * s.k) * world_size_}, lopt.dtype(at::kByte)));
  auto handle = comm_.allgather(*s.send_view.get(), *s.recv_view.get());
  count_sent(allgather_bytes(8 * static_cast<uint64_t>(s.k), world_size_));
  const DLTensor* flat = bucket.flat;
  return std::make_unique<StagedRequest>(std::move(handle),
                                         [this, b, flat] { finish_generic(b, flat); });
}

void TopkReducer::finish_generic(size_t b, const DLTensor* flat) {
  const BucketLayout& l = layouts_[b];
  State& s = state_[b];
  const auto k = static_cast<int64_t>(s.k);
  at::Tensor rv = s.recv_view.tensor().view(at::kInt).view({world_size_, k, 2});
  at::Tensor index =
      rv.select(2, 0).to(at::kLong).bitwise_and(static_cast<int64_t>(0xFFFFFFFF));  // uint32
  at::Tensor value = rv.select(2, 1).contiguous().view(at::kFloat);
  at::Tensor work = at::zeros({static_cast<int64_t>(l.length)},
                              at::TensorOptions().dtype(at::kFloat).device(l.device));
  if (k > 0) {
    // One int64 to the host: a bad peer index must be an error, not a device assert.
    const int64_t top = index.max().item<int64_t>();
    if (top >= static_cast<int64_t>(l.length))
      throw sdk::Error(DOPT_ERR_COMM, "topk: a peer sent index " + std::to_string(top) +
                                          " past bucket " + std::to_string(b) + "'s " +
                                          std::to_string(l.length) + " elements");
    for (int32_t r = 0; r < world_size_; ++r)  // rank order, as the CPU kernels
      work.index_add_(0, index.select(0, r), value.select(0, r));
  }
  work.div_(at::full({}, static_cast<double>(world_size_), work.options()));
  store_work(work, *flat);
  s.send_view = sdk::DLView();
  s.recv_view = sdk::DLView();
}

}  // namespace distopt::plugins::compress
