// Fashion-MNIST from its IDX files (gzip'd or plain), read with zlib.
// Torch-free: the training loop turns the bytes into tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distopt/error.hpp"

namespace distopt::train {

/// Default location (Debian package dataset-fashion-mnist).
constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
/// Pixel statistics of the training set, on the 0..1 scale: x = (p/255 - mean) / std.
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;

/// Missing, unreadable or malformed data file; the message names the file.
class DataError : public Error {
  using Error::Error;
};

/// Images and labels of one split, as stored: row-major uint8 pixels.
struct ImageSet {
  int64_t count = 0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  ///< count * rows * cols, 0..255
  std::vector<uint8_t> labels;  ///< count, each < num_classes
};

struct FashionMnist {
  ImageSet train;  ///< 60,000 images
  ImageSet test;   ///< 10,000 images
  static constexpr int kNumClasses = 10;
};

/// Whole content of `path`, decompressed if it is gzip (zlib's gzread reads
/// plain files as they are). Throws DataError naming the file.
std::vector<uint8_t> read_maybe_gzip(const std::string& path);

/// Parse an IDX3 image file (magic 0x00000803, big-endian dims) and an IDX1
/// label file (magic 0x00000801) of the same count; labels must be
/// < num_classes. Throws DataError naming the offending file and what is wrong
/// (bad magic, truncated, count mismatch, label out of range).
ImageSet load_idx_pair(const std::string& images_path, const std::string& labels_path,
                       int num_classes);

/// Load both splits from `dir`: train-images-idx3-ubyte[.gz],
/// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
/// t10k-labels-idx1-ubyte[.gz] (the .gz name is preferred). Throws DataError
/// naming the missing or malformed file.
FashionMnist load_fashion_mnist(const std::string& dir = kDefaultFashionMnistDir);
/// Why load_fashion_mnist(dir) would fail for want of a file (the first
/// missing one, as it would name it), or "" when all four are there. Reads
/// nothing.
std::string fashion_mnist_missing(const std::string& dir);

/// The number of images in Fashion-MNIST's training split in `dir`, read
/// from the IDX header of train-images-idx3-ubyte[.gz] alone (for `distopt
/// check`, which loads no data). Throws DataError naming the file.
int64_t fashion_mnist_train_count(const std::string& dir);

}  // namespace distopt::train
