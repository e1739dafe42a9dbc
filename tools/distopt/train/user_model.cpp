// TorchScript models and torch.save'd tensors for `distopt train` (see user_model.hpp).
#include "train/user_model.hpp"

#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "distopt/error.hpp"

namespace distopt::train {
namespace {

// A TorchScript module behind the Classifier interface. The nn::Module tree
// mirrors the script module's (one empty module per submodule), holding the
// same tensors, so named_parameters() gives PyTorch's names.
class ScriptClassifier : public Classifier {
 public:
  explicit ScriptClassifier(torch::jit::Module m) : m_(std::move(m)) { mirror(m_, *this); }

  torch::Tensor forward(const torch::Tensor& x) override {
    torch::jit::IValue out = m_.forward({x});
    if (!out.isTensor())
      throw Error("train.model: the TorchScript module's forward returned " + out.tagKind() +
                  ", not a tensor of logits [B, classes]");
    return out.toTensor();
  }

  void train(bool on) override {
    m_.train(on);
    torch::nn::Module::train(on);
  }

 private:
  static void mirror(const torch::jit::Module& jm, torch::nn::Module& nm) {
    for (const auto& p : jm.named_parameters(/*recurse=*/false))
      nm.register_parameter(p.name, p.value, p.value.requires_grad());
    for (const auto& b : jm.named_buffers(/*recurse=*/false)) nm.register_buffer(b.name, b.value);
    for (const auto& c : jm.named_children()) {
      auto child = std::make_shared<torch::nn::Module>();
      mirror(c.value, *child);
      nm.register_module(c.name, child);
    }
  }

  torch::jit::Module m_;
};

std::vector<char> read_all(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(std::string(what) + " " + path + ": cannot open the file");
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The value of the first of `keys` present in `d`, else an undefined tensor.
at::Tensor entry(const c10::impl::GenericDict& d, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    for (const auto& kv : d)
      if (kv.key().isString() && kv.key().toStringRef() == k && kv.value().isTensor())
        return kv.value().toTensor();
  return {};
}

}  // namespace

std::shared_ptr<Classifier> load_torchscript_model(const std::string& path) {
  try {
    return std::make_shared<ScriptClassifier>(torch::jit::load(path));
  } catch (const c10::Error& e) {
    throw Error("train.model.torchscript " + path +
                ": not a TorchScript file (torch.jit.save of torch.jit.script(model) or "
                "torch.jit.trace(model, example)): " +
                e.what_without_backtrace());
  }
}

TensorSet load_tensor_set(const std::string& path) {
  const std::vector<char> bytes = read_all(path, "train.tensors");
  torch::jit::IValue v;
  try {
    v = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw Error("train.tensors " + path +
                ": not a file of torch.save: " + e.what_without_backtrace());
  }
  TensorSet s;
  if (v.isGenericDict()) {
    const auto d = v.toGenericDict();
    s.inputs = entry(d, {"inputs", "x", "data"});
    s.labels = entry(d, {"labels", "y", "targets"});
  } else if (v.isTuple() || v.isList()) {
    std::vector<torch::jit::IValue> items;
    if (v.isTuple())
      for (const auto& e : v.toTupleRef().elements()) items.push_back(e);
    else
      for (const auto& e : v.toListRef()) items.push_back(e);
    if (items.size() == 2 && items[0].isTensor() && items[1].isTensor()) {
      s.inputs = items[0].toTensor();
      s.labels = items[1].toTensor();
    }
  }
  if (!s.inputs.defined() || !s.labels.defined())
    throw Error("train.tensors " + path +
                ": expected {'inputs': tensor, 'labels': tensor} or a tuple (inputs, labels) "
                "from torch.save, got " +
                v.tagKind());
  if (s.inputs.dim() < 1 || s.labels.dim() != 1 || s.inputs.size(0) != s.labels.size(0))
    throw Error("train.tensors " + path + ": inputs " + c10::str(s.inputs.sizes()) +
                " and labels " + c10::str(s.labels.sizes()) +
                " must be [N, ...] and [N] (one label per input)");
  if (at::isFloatingType(s.labels.scalar_type()) || s.labels.scalar_type() == at::kBool)
    throw Error("train.tensors " + path + ": labels must be integers (class indices), got " +
                std::string(c10::toString(s.labels.scalar_type())));
  s.inputs = s.inputs.contiguous();
  s.labels = s.labels.to(at::kLong).contiguous();
  if (s.labels.numel() > 0 && s.labels.min().item<int64_t>() < 0)
    throw Error("train.tensors " + path + ": a label is negative");
  return s;
}

}  // namespace distopt::train
