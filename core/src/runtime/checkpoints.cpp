// Runtime's checkpoints: save_checkpoint / load_checkpoint run the directory
// protocol (state/protocol.hpp) on the optimizer's side of it
// (optim/snapshot.hpp) over the control communicator; consolidate gathers
// every rank's state to one rank, as ZeroRedundancyOptimizer's
// consolidate_state_dict.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "optim/snapshot.hpp"
#include "state/consolidate.hpp"
#include "state/protocol.hpp"
#include "state/shard_state.hpp"
#include "state/state_source.hpp"

namespace distopt {
namespace {

constexpr int kTag = 0x0C0C;  // consolidate's sends on the control communicator

checkpoint::Group group_of(Runtime& rt) {
  return {rt.control_communicator().ref(), rt.rank(), rt.world_size()};
}

}  // namespace

CheckpointInfo Runtime::save_checkpoint(const std::string& dir, torch::nn::Module& model,
                                        DistributedOptimizer& opt, const CheckpointExtra& extra,
                                        int keep) {
  optim::OptimizerCheckpoint p(model, opt);
  return checkpoint::save(dir, p, extra, keep, group_of(*this));
}

CheckpointInfo Runtime::load_checkpoint(const std::string& dir, torch::nn::Module& model,
                                        DistributedOptimizer& opt) {
  optim::OptimizerCheckpoint p(model, opt);
  return checkpoint::load(dir, p, group_of(*this));
}

std::map<std::string, torch::Tensor> Runtime::consolidate(torch::nn::Module& model,
                                                          DistributedOptimizer& opt, int to) {
  const int rank = this->rank(), world = world_size();
  if (to < 0 || to >= world)
    throw ConfigError("consolidate: rank " + std::to_string(to) + " is not a rank of this job");
  state::ShardState mine = optim::snapshot(model, opt, rank);
  std::vector<char> bytes = mine.encode(rank, world);
  at::Tensor sizes = at::zeros({world}, at::kLong);
  sizes[rank] = static_cast<int64_t>(bytes.size());
  allreduce(sizes, /*average=*/false);
  if (rank != to) {
    at::Tensor buf = at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte);
    sdk::DLView v(buf);
    control_communicator().send(*v.get(), to, kTag).wait();
    return {};
  }
  std::vector<state::ShardState> shards;
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      shards.push_back(state::ShardState::decode(bytes, "rank " + std::to_string(r), r, world));
      continue;
    }
    at::Tensor buf = at::empty({sizes[r].item<int64_t>()}, at::kByte);
    sdk::DLView v(buf);
    control_communicator().recv(*v.get(), r, kTag).wait();
    std::vector<char> got(static_cast<const char*>(buf.data_ptr()),
                          static_cast<const char*>(buf.data_ptr()) + buf.numel());
    shards.push_back(state::ShardState::decode(got, "rank " + std::to_string(r), r, world));
  }
  state::StateSource src(std::move(shards), rank, world);
  return checkpoint::assemble(src);
}

}  // namespace distopt
