// Consolidation: every logical tensor whole in one place (assemble), and a
// checkpoint directory written as one torch.load-able file
// (consolidate_checkpoint). Runtime::consolidate gathers over the
// communicator first (runtime/checkpoints.cpp).
#include "state/consolidate.hpp"

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
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

// torch::pickle_save's zip archive, but with untagged containers: its
// default tags each dict and list with its element types through the global
// torch.jit._pickle.restore_type_tag, which torch.load refuses under
// weights_only=True (the default from PyTorch 2.6). Python's torch.save
// writes no such tag, and neither does this.
std::vector<char> pickle_for_torch_load(const c10::IValue& value) {
  std::vector<char> data;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t n) { data.insert(data.end(), buf, buf + n); }, nullptr, nullptr,
      nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* buf, size_t n) {
    const char* bytes = static_cast<const char*>(buf);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", data.data(), data.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
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
  return pickle_for_torch_load(root);
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
