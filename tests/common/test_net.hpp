// The small MLP of the distributed equivalence tests (in -> 32 -> 16 ->
// classes, in = 20 and classes = 10 by default, ReLU between; modules fc1,
// fc2, fc3 registered in that order, so equal seeds give equal parameters in
// every test), and a model's parameters flattened to doubles. Include
// before torch_doctest.hpp.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

namespace distopt::test {

struct Mlp3Impl : torch::nn::Module {
  explicit Mlp3Impl(int64_t in = 20, int64_t classes = 10) {
    fc1 = register_module("fc1", torch::nn::Linear(in, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, classes));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc3->forward(at::relu(fc2->forward(at::relu(fc1->forward(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp3);

/// Every parameter of `net` (a module holder), in registration order, as doubles.
template <class Holder>
std::vector<double> flat_params(Holder& net) {
  std::vector<double> v;
  for (const auto& p : net->parameters()) {
    at::Tensor c = p.detach().to(at::kDouble).contiguous().view(-1);
    v.insert(v.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return v;
}

}  // namespace distopt::test
