// Your own model and data in `distopt train`: a TorchScript module
// (`train.model: {torchscript: PATH}`) and tensors saved from Python with
// torch.save (`train.dataset: tensors`).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "train/models.hpp"

namespace distopt::train {

/// Load the TorchScript file `path` (torch.jit.save of a scripted or traced
/// module) as a Classifier: forward(inputs) runs the module's forward and
/// must return logits [B, classes]. Its parameters and buffers are the
/// module's own tensors (shared, not copied), registered under the same
/// dotted names as in PyTorch ("fc1.weight"), so the optimizer trains the
/// module, checkpoints hold its state_dict's names and `consolidate` writes
/// a dict PyTorch's load_state_dict takes. train()/eval() reach the module.
/// Throws distopt::Error naming the file when it cannot be loaded.
std::shared_ptr<Classifier> load_torchscript_model(const std::string& path);

/// A split of `dataset: tensors`: inputs [N, ...] (any dtype; the trainer
/// casts batches to the compute dtype) and labels int64 [N] in
/// [0, classes).
struct TensorSet {
  at::Tensor inputs, labels;
};

/// Read `path`, a file of Python's torch.save holding a dict {"inputs": T,
/// "labels": L} (also "x"/"y" or "data"/"targets") or a tuple/list (T, L).
/// Labels must be integers with one per input. Throws distopt::Error naming
/// the file and what is wrong.
TensorSet load_tensor_set(const std::string& path);

}  // namespace distopt::train
