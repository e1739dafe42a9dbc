// Consolidation: every logical tensor whole in one place (assemble), and a
// checkpoint directory written as one torch.load-able file
// (consolidate_checkpoint). Runtime::consolidate gathers over the
// communicator first (runtime/checkpoints.cpp).
#include "state/consolidate.hpp"

#include <ATen/core/Dict.h>
#include <torch/nn/module.h>
#include <torch/serialize.h>

#include "distopt/checkpoint.hpp"
#include "distopt/error.hpp"
#include "state/atomic_file.hpp"
#include "state/reading.hpp"
#include "state/state_source.hpp"

namespace distopt {

namespace checkpoint {

std::map<std::string, at::Tensor> assemble(const state::StateSource& src) {
  std::map<std::string, at::Tensor> out;
  for (const std::string& key : src.keys()) {
    const state::StateEntry& f = src.first(key);
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

namespace {

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
  state::StateSource src(std::move(l.shards), 0, l.manifest.world_size);
  write_atomic(out_path, python_file(assemble(src), l.manifest));
}

}  // namespace distopt
