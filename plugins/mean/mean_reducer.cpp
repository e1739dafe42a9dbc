#include "mean_reducer.hpp"

#include <string>

#include "distopt/sdk/base/traffic.hpp"

namespace distopt::plugins::mean {
namespace {

/// The reducer's request: the communicator's allreduce request.
class MeanRequest : public sdk::Request {
 public:
  explicit MeanRequest(sdk::CommHandle h) : h_(std::move(h)) {}
  bool test() override { return h_.test(); }
  bool wait(int64_t timeout_ms) override {
    // The communicator reports its own timeout as DOPT_ERR_TIMEOUT (thrown,
    // detail kept in the error sink), so reaching here means success.
    h_.wait(timeout_ms);
    return true;
  }

 private:
  sdk::CommHandle h_;
};

}  // namespace

MeanReducer::MeanReducer(const dopt_create_args& args, dopt_comm_ref comm, const dopt_bucket*,
                         size_t)
    : comm_(comm), world_size_(args.world_size) {
  if (!comm.vt || !comm.comm) throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "mean: no communicator");
  if (comm_.world_size() != args.world_size)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT,
                     "mean: communicator has " + std::to_string(comm_.world_size()) +
                         " ranks, job has " + std::to_string(args.world_size));
}

std::unique_ptr<sdk::Request> MeanReducer::reduce(const dopt_bucket& bucket) {
  if (!bucket.flat)
    throw sdk::Error(DOPT_ERR_INVALID_ARGUMENT, "mean: bucket without a flat buffer");
  auto h = comm_.allreduce(*bucket.flat, *bucket.flat, DOPT_REDUCE_AVG);
  uint64_t sent = sdk::ring_allreduce_bytes(sdk::dl_nbytes(*bucket.flat), world_size_);
  bytes_sent_ += sent;
  sdk::metric_add("reducer.bytes_sent", static_cast<double>(sent));
  return std::make_unique<MeanRequest>(std::move(h));
}

}  // namespace distopt::plugins::mean
