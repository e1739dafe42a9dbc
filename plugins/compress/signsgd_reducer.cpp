#include "signsgd_reducer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bitpack.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::plugins::compress {

SignSgdReducer::SignSgdReducer(const dopt_create_args& args, dopt_comm_ref comm,
                               const dopt_bucket* buckets, size_t num_buckets)
    : CompressReducer("signsgd", args, comm, buckets, num_buckets),
      error_feedback_(sdk::OptionsView(args.options).get_bool("error_feedback")),
      momentum_(sdk::OptionsView(args.options).get_double("momentum"), false, layouts_),
      state_(layouts_.size()) {
  std::vector<at::Tensor> zeros;
  if (error_feedback_) zeros = zero_buffers();
  for (size_t b = 0; b < layouts_.size(); ++b) {
    const BucketLayout& l = layouts_[b];
    State& s = state_[b];
    if (error_feedback_) s.residual = zeros[b];
    if (!l.generic) {
      s.send.resize(message_bytes(l));
      s.recv.resize(s.send.size() * static_cast<size_t>(world_size_));
      continue;
    }
    // Index maps of the generic path, built once on the host and moved.
    const auto ne = static_cast<int64_t>(l.entries.size());
    std::vector<int64_t> seg(l.length, ne), slot_of(l.length, 0), slot_src;
    std::vector<double> count;
    for (size_t t = 0; t < l.entries.size(); ++t) {
      const Slice& e = l.entries[t];
      const auto base = static_cast<int64_t>(slot_src.size());
      for (size_t i = 0; i < e.numel; ++i) {
        seg[e.offset + i] = static_cast<int64_t>(t);
        slot_of[e.offset + i] = base + static_cast<int64_t>(i);
        slot_src.push_back(static_cast<int64_t>(e.offset + i));
      }
      slot_src.resize(static_cast<size_t>(base) + 8 * packed_bytes(e.numel),
                      static_cast<int64_t>(l.length));
      count.push_back(static_cast<double>(e.numel));
    }
    s.seg = at::tensor(seg, at::kLong).to(l.device);
    s.count = at::tensor(count, at::kDouble).to(l.device);
    s.slot_src = at::tensor(slot_src, at::kLong).to(l.device);
    s.slot_of = at::tensor(slot_of, at::kLong).to(l.device);
    s.bit = at::tensor(std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128}, at::kLong)
                .to(at::kByte)
                .to(l.device);
  }
}

size_t SignSgdReducer::message_bytes(const BucketLayout& l) {
  size_t bytes = 4 * l.entries.size();
  for (const Slice& e : l.entries) bytes += packed_bytes(e.numel);
  return bytes;
}

std::unique_ptr<sdk::Request> SignSgdReducer::reduce(const dopt_bucket& bucket) {
  const BucketLayout& l = layout_of(component_, layouts_, bucket);
  const size_t b = static_cast<size_t>(bucket.index);
  State& s = state_[b];
  if (l.generic) return reduce_generic(b, bucket);
  load_float(*bucket.flat, s.work);
  uint8_t* scales = s.send.data();
  uint8_t* bits = scales + 4 * l.entries.size();
  for (size_t t = 0; t < l.entries.size(); ++t) {
    const Slice& e = l.entries[t];
    float* p = s.work.data() + e.offset;
    float* res = error_feedback_ ? s.residual.data_ptr<float>() + e.offset : nullptr;
    momentum_.accumulate(b, e, p);
    if (res)
      for (size_t i = 0; i < e.numel; ++i) p[i] += res[i];
    double sum = 0;
    for (size_t i = 0; i < e.numel; ++i) sum += std::fabs(p[i]);
    const float scale = static_cast<float>(sum / static_cast<double>(e.numel));
    std::memcpy(scales + 4 * t, &scale, 4);
    pack_signs(p, e.numel, bits);
    if (res) std::copy(p, p + e.numel, res);  // p; finish() subtracts what was applied
    bits += packed_bytes(e.numel);
  }
  s.send_dl = host_tensor(s.send.data(), static_cast<int64_t>(s.send.size()), kU8, &s.send_shape);
  s.recv_dl = host_tensor(s.recv.data(), static_cast<int64_t>(s.recv.size()), kU8, &s.recv_shape);
  auto handle = comm_.allgather(s.send_dl, s.recv_dl);
  count_sent(allgather_bytes(s.send.size(), world_size_));
  DLTensor* flat = bucket.flat;
  return std::make_unique<StagedRequest>(std::move(handle), [this, b, flat] { finish(b, flat); });
}

std::vector<at::Tensor> SignSgdReducer::residuals() {
  std::vector<at::Tensor> out;
  for (State& s : state_) out.push_back(s.residual);
  return out;
}

void SignSgdReducer::save_state(sdk::StateWriter& w) {
  save_feedback_state(w, residuals(), momentum_);
}

void SignSgdReducer::load_state(const sdk::StateReader& r) {
  load_feedback_state(r, residuals(), momentum_);
}

void SignSgdReducer::finish(size_t b, DLTensor* flat) {
  const BucketLayout& l = layouts_[b];
  State& s = state_[b];
  const size_t msg = s.send.size(), ne = l.entries.size();
  const auto w = static_cast<size_t>(world_size_);
  std::fill(s.work.begin(), s.work.end(), 0.0f);
  size_t bit_base = 4 * ne;
  for (size_t t = 0; t < ne; ++t) {
    const Slice& e = l.entries[t];
    float scale = 0;
    for (size_t r = 0; r < w; ++r) {
      float sr;
      std::memcpy(&sr, s.recv.data() + r * msg + 4 * t, 4);
      scale += sr;
    }
    scale /= static_cast<float>(w);
    float* out = s.work.data() + e.offset;
    float* res = error_feedback_ ? s.residual.data_ptr<float>() + e.offset : nullptr;
    // Byte-wise: count the negative votes of 8 elements over all ranks at
    // once (same result as unpack_sign per element, several times faster).
    const uint8_t* run = s.recv.data() + bit_base;
    for (size_t byte = 0; byte < packed_bytes(e.numel); ++byte) {
      int neg[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (size_t r = 0; r < w; ++r) {
        const unsigned v = run[r * msg + byte];
        for (int k = 0; k < 8; ++k) neg[k] += static_cast<int>((v >> k) & 1u);
      }
      const size_t base = 8 * byte, m = std::min<size_t>(8, e.numel - base);
      for (size_t k = 0; k < m; ++k) {
        const int votes = static_cast<int>(w) - 2 * neg[k];  // (+1 votes) - (-1 votes)
        out[base + k] = votes > 0 ? scale : (votes < 0 ? -scale : 0.0f);
      }
    }
    if (res)
      for (size_t i = 0; i < e.numel; ++i) res[i] -= out[i];
    bit_base += packed_bytes(e.numel);
  }
  store_float(s.work, *flat);
}

// The generic path: the CPU kernels' arithmetic, as whole-bucket libtorch ops.
std::unique_ptr<sdk::Request> SignSgdReducer::reduce_generic(size_t b, const dopt_bucket& bucket) {
  const BucketLayout& l = layouts_[b];
  State& s = state_[b];
  const auto ne = static_cast<int64_t>(l.entries.size());
  at::Tensor p = load_work(*bucket.flat, l, /*zero_padding=*/true);
  momentum_.accumulate(b, p);
  if (error_feedback_) p.add_(s.residual);
  // mean |p| per entry: double sums in element order (index_add_), / numel, to float.
  at::Tensor sums = at::zeros({ne + 1}, p.options().dtype(at::kDouble))
                        .index_add_(0, s.seg, p.abs().to(at::kDouble));
  at::Tensor scale = sums.narrow(0, 0, ne).div(s.count).to(at::kFloat);
  // Sign bits: 1 = p < 0, each entry's run padded to whole bytes with 0 bits.
  at::Tensor neg = at::cat({p.lt(0).to(at::kByte), at::zeros({1}, p.options().dtype(at::kByte))});
  at::Tensor packed = neg.index_select(0, s.slot_src).view({-1, 8}).mul(s.bit).sum(1).to(at::kByte);
  s.send_view = sdk::DLView(at::cat({scale.view(at::kByte), packed}));
  const int64_t msg = s.send_view.tensor().numel();
  s.recv_view = sdk::DLView(at::empty({msg * world_size_}, packed.options()));
  if (error_feedback_) s.residual.copy_(p);  // p; finish subtracts what was applied
  auto handle = comm_.allgather(*s.send_view.get(), *s.recv_view.get());
  count_sent(allgather_bytes(static_cast<uint64_t>(msg), world_size_));
  const DLTensor* flat = bucket.flat;
  return std::make_unique<StagedRequest>(std::move(handle),
                                         [this, b, flat] { finish_generic(b, flat); });
}

void SignSgdReducer::finish_generic(size_t b, const DLTensor* flat) {
  const BucketLayout& l = layouts_[b];
  State& s = state_[b];
  const auto ne = static_cast<int64_t>(l.entries.size());
  const int64_t msg = s.send_view.tensor().numel();
  at::Tensor rv = s.recv_view.tensor().view({world_size_, msg});
  // Scales: summed over ranks in rank order, then / W, in float32 (the CPU loop).
  at::Tensor sc = rv.narrow(1, 0, 4 * ne).contiguous().view(at::kFloat);  // [W, ne]
  at::Tensor scale = sc.select(0, 0).clone();
  for (int32_t r = 1; r < world_size_; ++r) scale.add_(sc.select(0, r));
  scale.div_(at::full({}, static_cast<double>(world_size_), scale.options()));
  // Negative votes per sign-bit slot over all ranks.
  at::Tensor neg = rv.narrow(1, 4 * ne, msg - 4 * ne)
                       .unsqueeze(2)
                       .bitwise_and(s.bit)
                       .ne(0)
                       .sum(at::IntArrayRef{0}, false, at::kInt)
                       .view({-1});
  at::Tensor votes = neg.index_select(0, s.slot_of).mul(-2).add(world_size_);  // (+1) - (-1)
  at::Tensor sc_e = at::cat({scale, at::zeros({1}, scale.options())}).index_select(0, s.seg);
  at::Tensor out =
      at::where(votes.gt(0), sc_e, at::where(votes.lt(0), sc_e.neg(), at::zeros_like(sc_e)));
  if (l.pad_index.defined()) out.index_fill_(0, l.pad_index, 0.0);
  if (error_feedback_) s.residual.sub_(out);
  store_work(out, *flat);
  s.send_view = sdk::DLView();
  s.recv_view = sdk::DLView();
}

}  // namespace distopt::plugins::compress
