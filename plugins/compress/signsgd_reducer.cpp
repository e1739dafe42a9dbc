#include "signsgd_reducer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bitpack.hpp"

namespace distopt::plugins::compress {

SignSgdReducer::SignSgdReducer(const dopt_create_args& args, dopt_comm_ref comm,
                               const dopt_bucket* buckets, size_t num_buckets)
    : CompressReducer("signsgd", args, comm, buckets, num_buckets),
      error_feedback_(sdk::OptionsView(args.options).get_bool("error_feedback")),
      momentum_(sdk::OptionsView(args.options).get_double("momentum"), false, layouts_),
      state_(layouts_.size()) {
  for (size_t b = 0; b < layouts_.size(); ++b) {
    if (error_feedback_) state_[b].residual.assign(layouts_[b].length, 0.0f);
    state_[b].send.resize(message_bytes(layouts_[b]));
    state_[b].recv.resize(state_[b].send.size() * static_cast<size_t>(world_size_));
  }
}

size_t SignSgdReducer::message_bytes(const BucketLayout& l) {
  size_t bytes = 4 * l.entries.size();
  for (const Slice& e : l.entries) bytes += packed_bytes(e.numel);
  return bytes;
}

std::unique_ptr<sdk::Request> SignSgdReducer::reduce(const dopt_bucket& bucket) {
  const BucketLayout& l = layout_of(who_, layouts_, bucket);
  const size_t b = static_cast<size_t>(bucket.index);
  State& s = state_[b];
  load_float(*bucket.flat, s.work);
  uint8_t* scales = s.send.data();
  uint8_t* bits = scales + 4 * l.entries.size();
  for (size_t t = 0; t < l.entries.size(); ++t) {
    const Slice& e = l.entries[t];
    float* p = s.work.data() + e.offset;
    float* res = error_feedback_ ? s.residual.data() + e.offset : nullptr;
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

std::vector<std::vector<float>*> SignSgdReducer::residuals() {
  std::vector<std::vector<float>*> out;
  for (State& s : state_) out.push_back(error_feedback_ ? &s.residual : nullptr);
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
    float* res = error_feedback_ ? s.residual.data() + e.offset : nullptr;
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

}  // namespace distopt::plugins::compress
