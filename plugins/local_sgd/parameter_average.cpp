#include "parameter_average.hpp"

#include "distopt/sdk/base/traffic.hpp"

namespace distopt::plugins::local_sgd {

ParameterAverage::ParameterAverage(const dopt_bucket* buckets, size_t num_buckets,
                                   const std::vector<at::Tensor>& params) {
  buckets_.reserve(num_buckets);
  for (size_t b = 0; b < num_buckets; ++b) buckets_.emplace_back(buckets[b], params, "local_sgd");
}

uint64_t ParameterAverage::run(sdk::CommView& comm) {
  at::NoGradGuard ng;
  const int32_t world = comm.world_size();
  if (world <= 1) return 0;
  std::vector<sdk::DLView> wire;
  std::vector<sdk::CommHandle> pending;
  wire.reserve(buckets_.size());
  uint64_t bytes = 0;
  for (auto& b : buckets_) {
    wire.emplace_back(b.pack());
    DLTensor& t = *wire.back().get();
    pending.push_back(comm.allreduce(t, t, DOPT_REDUCE_SUM));
    bytes += sdk::ring_allreduce_bytes(b.nbytes(), world);
  }
  for (auto& h : pending) h.wait();  // a failure frees the other requests on unwinding
  for (auto& b : buckets_) b.unpack(b.buffer().div_(world));
  return bytes;
}

}  // namespace distopt::plugins::local_sgd
