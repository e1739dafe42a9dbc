// The models `distopt train` trains (torch::nn): small ones for Fashion-MNIST
// and a ResNet-18-like CNN sized for throughput work on a GPU. Each layer
// with parameters (mlp, cnn) and each residual block (resnet) is a
// distopt::ShardedUnit, the units of parameter sharding (zero stage 3); with
// other algorithms the wrappers only forward. Parameter names are those of
// the unwrapped layers.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distopt/sharded_unit.hpp"

namespace distopt::train {

/// An image classifier: forward maps float images [B, channels, rows, cols]
/// (normalised) to logits [B, num_classes]. Not thread-safe (torch modules).
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

/// mlp: flatten -> Linear(channels*rows*cols, 512) -> ReLU -> Linear(512, 256)
/// -> ReLU -> Linear(256, classes). Parameters fc1/fc2/fc3.{weight,bias};
/// `hidden` widens the two hidden layers (512 and 256 by default) for
/// memory and throughput work.
class Mlp : public Classifier {
 public:
  Mlp(int64_t channels, int64_t rows, int64_t cols, int64_t classes, int64_t hidden = 512);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  ShardedUnit fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

/// cnn: Conv2d(channels, 16, 5, pad 2) -> ReLU -> MaxPool 2 -> Conv2d(16, 32, 5,
/// pad 2) -> ReLU -> MaxPool 2 -> flatten -> Linear(32*(rows/4)*(cols/4), 128)
/// -> ReLU -> Linear(128, classes). Parameters conv1/conv2/fc1/fc2.{weight,bias}.
class Cnn : public Classifier {
 public:
  Cnn(int64_t channels, int64_t rows, int64_t cols, int64_t classes);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  ShardedUnit conv1{nullptr}, conv2{nullptr}, fc1{nullptr}, fc2{nullptr};
};

/// One basic residual block of ResNet-18: conv3x3(stride) -> GN -> ReLU ->
/// conv3x3 -> GN, plus the input (through conv1x1(stride) -> GN when the shape
/// changes), then ReLU.
class BasicBlock : public torch::nn::Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride, int64_t groups);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, down{nullptr};
  torch::nn::GroupNorm gn1{nullptr}, gn2{nullptr}, down_gn{nullptr};
};

/// resnet: ResNet-18 for small images (the CIFAR variant: 3x3 stem, no max
/// pool): conv3x3(channels, w) -> GN -> ReLU, then 4 stages of 2 BasicBlocks
/// with w, 2w, 4w, 8w channels (strides 1, 2, 2, 2), global average pool,
/// Linear(8w, classes). GroupNorm (gcd(8, w) groups) instead of BatchNorm, so
/// the model has no buffers to synchronise and behaves the same in train and
/// eval mode. w = 64 is ResNet-18's 11.2M parameters; the parameter count
/// grows as w^2 (w = 8: about 0.18M). Any image size >= 8x8.
class ResNet : public Classifier {
 public:
  ResNet(int64_t channels, int64_t classes, int64_t width);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  ShardedUnit stem{nullptr}, stem_gn{nullptr};
  std::vector<ShardedUnit> blocks;
  ShardedUnit fc{nullptr};
};

/// Build model `name` ("mlp", "cnn" or "resnet") for images [channels, rows,
/// cols] and `classes` classes, with weights drawn after
/// torch::manual_seed(seed), so every rank that passes the same seed starts
/// from the same parameters. `width` is resnet's base channel count (>= 1;
/// ignored by the others). Throws distopt::Error for an unknown name (listing
/// the known ones) or a bad width.
std::shared_ptr<Classifier> make_model(const std::string& name, int64_t channels, int64_t rows,
                                       int64_t cols, int64_t classes, int64_t seed,
                                       int64_t width = 8);

/// Number of scalar parameters of a module.
int64_t parameter_count(const torch::nn::Module& m);

}  // namespace distopt::train
