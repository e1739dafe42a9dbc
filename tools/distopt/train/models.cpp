// MLP and CNN for small single-channel images; ResNet-18-like CNN.
#include "train/models.hpp"

#include <ATen/ATen.h>

#include <numeric>

#include "distopt/error.hpp"

namespace distopt::train {

Mlp::Mlp(int64_t channels, int64_t rows, int64_t cols, int64_t classes, int64_t hidden) {
  fc1 = register_module("fc1", ShardedUnit(torch::nn::Linear(channels * rows * cols, hidden)));
  fc2 = register_module("fc2", ShardedUnit(torch::nn::Linear(hidden, hidden / 2)));
  fc3 = register_module("fc3", ShardedUnit(torch::nn::Linear(hidden / 2, classes)));
}

torch::Tensor Mlp::forward(const torch::Tensor& x) {
  auto h = x.flatten(1);
  h = at::relu(fc1->forward(h));
  h = at::relu(fc2->forward(h));
  return fc3->forward(h);
}

Cnn::Cnn(int64_t channels, int64_t rows, int64_t cols, int64_t classes) {
  conv1 = register_module(
      "conv1",
      ShardedUnit(torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 16, 5).padding(2))));
  conv2 = register_module(
      "conv2", ShardedUnit(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2))));
  fc1 = register_module("fc1", ShardedUnit(torch::nn::Linear(32 * (rows / 4) * (cols / 4), 128)));
  fc2 = register_module("fc2", ShardedUnit(torch::nn::Linear(128, classes)));
}

torch::Tensor Cnn::forward(const torch::Tensor& x) {
  auto h = at::max_pool2d(at::relu(conv1->forward(x)), {2, 2});
  h = at::max_pool2d(at::relu(conv2->forward(h)), {2, 2});
  h = at::relu(fc1->forward(h.flatten(1)));
  return fc2->forward(h);
}

namespace {
torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}
torch::nn::GroupNorm gn(int64_t groups, int64_t ch) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, ch));
}
}  // namespace

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride, int64_t groups) {
  conv1 = register_module("conv1", conv(in, out, 3, stride));
  gn1 = register_module("gn1", gn(groups, out));
  conv2 = register_module("conv2", conv(out, out, 3, 1));
  gn2 = register_module("gn2", gn(groups, out));
  if (stride != 1 || in != out) {
    down = register_module("down", conv(in, out, 1, stride));
    down_gn = register_module("down_gn", gn(groups, out));
  }
}

torch::Tensor BasicBlock::forward(const torch::Tensor& x) {
  auto h = at::relu(gn1->forward(conv1->forward(x)));
  h = gn2->forward(conv2->forward(h));
  return at::relu(h + (down ? down_gn->forward(down->forward(x)) : x));
}

ResNet::ResNet(int64_t channels, int64_t classes, int64_t width) {
  const int64_t groups = std::gcd<int64_t>(8, width);  // divides every stage's channels
  stem = register_module("stem", ShardedUnit(conv(channels, width, 3, 1)));
  stem_gn = register_module("stem_gn", ShardedUnit(gn(groups, width)));
  int64_t in = width;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t out = width << stage;
    for (int b = 0; b < 2; ++b) {
      auto block = std::make_shared<BasicBlock>(in, out, stage > 0 && b == 0 ? 2 : 1, groups);
      blocks.push_back(register_module(
          "layer" + std::to_string(stage + 1) + "_" + std::to_string(b), ShardedUnit(block)));
      in = out;
    }
  }
  fc = register_module("fc", ShardedUnit(torch::nn::Linear(in, classes)));
}

torch::Tensor ResNet::forward(const torch::Tensor& x) {
  auto h = at::relu(stem_gn->forward(stem->forward(x)));
  for (auto& b : blocks) h = b->forward(h);
  return fc->forward(h.mean({2, 3}));
}

std::shared_ptr<Classifier> make_model(const std::string& name, int64_t channels, int64_t rows,
                                       int64_t cols, int64_t classes, int64_t seed, int64_t width) {
  at::manual_seed(static_cast<uint64_t>(seed));
  if (name == "mlp") return std::make_shared<Mlp>(channels, rows, cols, classes);
  if (name == "cnn") return std::make_shared<Cnn>(channels, rows, cols, classes);
  if (name == "resnet") {
    if (width < 1) throw Error("train.model_width must be at least 1 for resnet");
    if (rows < 8 || cols < 8)
      throw Error("resnet needs images of at least 8x8 (it halves them 3 times), got " +
                  std::to_string(rows) + "x" + std::to_string(cols));
    return std::make_shared<ResNet>(channels, classes, width);
  }
  throw Error("unknown model '" + name + "' in train.model (known: mlp, cnn, resnet)");
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace distopt::train
