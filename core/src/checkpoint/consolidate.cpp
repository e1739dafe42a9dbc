// Consolidation: every logical tensor whole in one place, either gathered
// over the communicator (Runtime::consolidate, as ZeroRedundancyOptimizer's
// consolidate_state_dict) or read from a checkpoint directory and written as
// one torch.load-able file (consolidate_checkpoint).
#include <ATen/core/Dict.h>
#include <torch/nn/module.h>
#include <torch/serialize.h>

#include "checkpoint/atomic_file.hpp"
#include "checkpoint/reading.hpp"
#include "checkpoint/snapshot.hpp"
#include "checkpoint/state_source.hpp"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt {

namespace checkpoint {
namespace {

constexpr int kTag = 0x0C0C;

// key -> whole tensor; rank-local entries once per saved rank as key@rank<r>.
std::map<std::string, at::Tensor> assemble(const StateSource& src) {
  std::map<std::string, at::Tensor> out;
  for (const std::string& key : src.keys()) {
    const StateEntry& f = src.first(key);
    if (f.kind == DOPT_STATE_SHARDED) {
      out[key] = src.whole(key);
      continue;
    }
    for (int r = 0; r < src.saved_world_size(); ++r) {
      at::Tensor t = src.local(key, r);
      if (t.defined()) out[key + "@rank" + std::to_string(r)] = t.view(f.shape);
    }
  }
  return out;
}

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

std::vector<char> python_file(const std::map<std::string, at::Tensor>& flat, const Manifest& m) {
  auto model = new_dict(), opt_state = new_dict(), state = new_dict();
  const std::string kModel = "model/", kOpt = "algorithm/optimizer/";
  std::map<std::string, c10::impl::GenericDict> per_param;
  for (const auto& [key, t] : flat) {
    if (key.rfind(kModel, 0) == 0) {
      model.insert(key.substr(kModel.size()), t);
    } else if (key.rfind(kOpt, 0) == 0 && key.find('@') == std::string::npos &&
               key.rfind('/') > kOpt.size()) {
      const size_t slash = key.rfind('/');
      const std::string param = key.substr(kOpt.size(), slash - kOpt.size());
      auto it = per_param.emplace(param, new_dict()).first;
      it->second.insert(key.substr(slash + 1), t);
    } else {
      state.insert(key, t);
    }
  }
  for (auto& [param, d] : per_param) opt_state.insert(param, d);
  auto root = new_dict();
  root.insert("format", std::string("distopt-consolidated-1"));
  root.insert("step", m.step);
  root.insert("world_size", static_cast<int64_t>(m.world_size));
  root.insert("algorithm", m.algorithm.plugin + "/" + m.algorithm.component);
  root.insert("reducer", m.reducer.plugin + "/" + m.reducer.component);
  root.insert("optimizer", m.optimizer);
  root.insert("model", model);
  root.insert("optimizer_state", opt_state);
  root.insert("state", state);
  return torch::pickle_save(root);
}

}  // namespace
}  // namespace checkpoint

void consolidate_checkpoint(const std::string& dir, const std::string& out_path) {
  using namespace checkpoint;
  Loaded l = read_newest(dir);
  StateSource src(std::move(l.shards), 0, l.manifest.world_size);
  write_atomic(out_path, python_file(assemble(src), l.manifest));
}

std::map<std::string, torch::Tensor> Runtime::consolidate(torch::nn::Module& model,
                                                          DistributedOptimizer& opt, int to) {
  using namespace checkpoint;
  const int rank = this->rank(), world = world_size();
  if (to < 0 || to >= world)
    throw ConfigError("consolidate: rank " + std::to_string(to) + " is not a rank of this job");
  ShardState mine = snapshot(model, opt, rank);
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
  std::vector<ShardState> shards;
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      shards.push_back(ShardState::decode(bytes, "rank " + std::to_string(r), r, world));
      continue;
    }
    at::Tensor buf = at::empty({sizes[r].item<int64_t>()}, at::kByte);
    sdk::DLView v(buf);
    control_communicator().recv(*v.get(), r, kTag).wait();
    std::vector<char> got(static_cast<const char*>(buf.data_ptr()),
                          static_cast<const char*>(buf.data_ptr()) + buf.numel());
    shards.push_back(ShardState::decode(got, "rank " + std::to_string(r), r, world));
  }
  StateSource src(std::move(shards), rank, world);
  return assemble(src);
}

}  // namespace distopt
