// MLP and CNN for 28x28 single-channel images.
#include "train/models.hpp"

#include <ATen/ATen.h>

#include "distopt/error.hpp"

namespace distopt::train {

Mlp::Mlp(int64_t rows, int64_t cols, int64_t classes) {
  fc1 = register_module("fc1", torch::nn::Linear(rows * cols, 512));
  fc2 = register_module("fc2", torch::nn::Linear(512, 256));
  fc3 = register_module("fc3", torch::nn::Linear(256, classes));
}

torch::Tensor Mlp::forward(const torch::Tensor& x) {
  auto h = x.flatten(1);
  h = at::relu(fc1->forward(h));
  h = at::relu(fc2->forward(h));
  return fc3->forward(h);
}

Cnn::Cnn(int64_t rows, int64_t cols, int64_t classes) {
  conv1 =
      register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)));
  conv2 =
      register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)));
  fc1 = register_module("fc1", torch::nn::Linear(32 * (rows / 4) * (cols / 4), 128));
  fc2 = register_module("fc2", torch::nn::Linear(128, classes));
}

torch::Tensor Cnn::forward(const torch::Tensor& x) {
  auto h = at::max_pool2d(at::relu(conv1->forward(x)), {2, 2});
  h = at::max_pool2d(at::relu(conv2->forward(h)), {2, 2});
  h = at::relu(fc1->forward(h.flatten(1)));
  return fc2->forward(h);
}

std::shared_ptr<Classifier> make_model(const std::string& name, int64_t rows, int64_t cols,
                                       int64_t classes, int64_t seed) {
  at::manual_seed(static_cast<uint64_t>(seed));
  if (name == "mlp") return std::make_shared<Mlp>(rows, cols, classes);
  if (name == "cnn") return std::make_shared<Cnn>(rows, cols, classes);
  throw Error("unknown model '" + name + "' in train.model (known: mlp, cnn)");
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace distopt::train
