#include "fp16_reducer.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace distopt::plugins::compress {

template <bool Bf16>
HalfCastReducer<Bf16>::HalfCastReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket* buckets,
                                       size_t num_buckets)
    : CompressReducer(Bf16 ? "bf16" : "fp16", args, comm, buckets, num_buckets), state_(layouts_.size()) {}

template <bool Bf16>
std::unique_ptr<sdk::Request> HalfCastReducer<Bf16>::reduce(const dopt_bucket& bucket) {
  using Half = std::conditional_t<Bf16, c10::BFloat16, c10::Half>;
  static_assert(sizeof(Half) == sizeof(uint16_t));
  const BucketLayout& l = layout_of(who_, layouts_, bucket);
  State& s = state_[static_cast<size_t>(bucket.index)];
  load_float(*bucket.flat, s.work);
  s.wire.resize(l.length);
  auto* h = reinterpret_cast<Half*>(s.wire.data());
  const float w = static_cast<float>(world_size_);
  for (size_t i = 0; i < l.length; ++i) h[i] = static_cast<Half>(s.work[i] / w);
  s.dl = host_tensor(s.wire.data(), static_cast<int64_t>(l.length), Bf16 ? kBF16 : kF16, &s.shape);
  auto handle = comm_.allreduce(s.dl, s.dl, DOPT_REDUCE_SUM);
  count_sent(ring_allreduce_bytes(2 * static_cast<uint64_t>(l.length), world_size_));
  DLTensor* flat = bucket.flat;
  return std::make_unique<StagedRequest>(std::move(handle), [&s, flat, h, n = l.length] {
    for (size_t i = 0; i < n; ++i) s.work[i] = static_cast<float>(h[i]);
    store_float(s.work, *flat);
  });
}

template class HalfCastReducer<false>;
template class HalfCastReducer<true>;

}  // namespace distopt::plugins::compress
