// The models `distopt train` trains on Fashion-MNIST (torch::nn).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <string>

namespace distopt::train {

/// An image classifier: forward maps float images [B, 1, rows, cols]
/// (normalised) to logits [B, num_classes]. Not thread-safe (torch modules).
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

/// mlp: flatten -> Linear(rows*cols, 512) -> ReLU -> Linear(512, 256) -> ReLU
/// -> Linear(256, classes). Parameters fc1/fc2/fc3.{weight,bias}.
class Mlp : public Classifier {
 public:
  Mlp(int64_t rows, int64_t cols, int64_t classes);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

/// cnn: Conv2d(1, 16, 5, pad 2) -> ReLU -> MaxPool 2 -> Conv2d(16, 32, 5, pad 2)
/// -> ReLU -> MaxPool 2 -> flatten -> Linear(32*(rows/4)*(cols/4), 128) -> ReLU
/// -> Linear(128, classes). Parameters conv1/conv2/fc1/fc2.{weight,bias}.
class Cnn : public Classifier {
 public:
  Cnn(int64_t rows, int64_t cols, int64_t classes);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

/// Build model `name` ("mlp" or "cnn") with weights drawn after
/// torch::manual_seed(seed), so every rank that passes the same seed starts
/// from the same parameters. Throws distopt::Error for an unknown name
/// (listing the known ones).
std::shared_ptr<Classifier> make_model(const std::string& name, int64_t rows, int64_t cols,
                                       int64_t classes, int64_t seed);

/// Number of scalar parameters of a module.
int64_t parameter_count(const torch::nn::Module& m);

}  // namespace distopt::train
