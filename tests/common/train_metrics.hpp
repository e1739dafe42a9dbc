// Helpers of the tests that run `distopt train` through the CLI: whether the
// Fashion-MNIST data set is installed, and the summary line of a metrics file.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "result_files.hpp"
#include "skip.hpp"

namespace distopt::test {

/// Where the dataset-fashion-mnist package installs the data.
inline const char* const kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Whether the Fashion-MNIST training images are installed.
inline bool fashion_mnist_installed() {
  return path_exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
}

/// The last line of a metrics file (JSON lines) whose "event" is "summary";
/// null when there is none.
inline nlohmann::json metrics_summary(const std::string& metrics_path) {
  nlohmann::json summary;
  std::ifstream f(metrics_path);
  for (std::string line; std::getline(f, line);)
    if (!line.empty() && nlohmann::json::parse(line)["event"] == "summary")
      summary = nlohmann::json::parse(line);
  return summary;
}

}  // namespace distopt::test

/// First statement of a TEST_CASE that trains on Fashion-MNIST: ends the
/// test case as skipped (skip.hpp: ctest reports the test "Skipped") when
/// the data set is not installed. tools/setup.sh installs it.
#define DISTOPT_SKIP_WITHOUT_FASHION_MNIST()                                                      \
  do {                                                                                            \
    if (!::distopt::test::fashion_mnist_installed())                                              \
      DISTOPT_SKIP_TEST_CASE(std::string("dataset-fashion-mnist is not installed (no ") +         \
                             ::distopt::test::kFashionMnistDir + "/train-images-idx3-ubyte.gz)"); \
  } while (0)
