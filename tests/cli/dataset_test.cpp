// The Fashion-MNIST IDX loader of `distopt train`: real files and broken ones.
#include "train/dataset.hpp"

#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "result_files.hpp"
#include "train_metrics.hpp"

using distopt::train::DataError;
using distopt::train::load_fashion_mnist;
using distopt::train::load_idx_pair;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/distopt_dataset_test_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { distopt::test::remove_tree(path); }
};

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

void append(std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
}

std::vector<uint8_t> images(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols,
                            size_t payload) {
  std::vector<uint8_t> b;
  append(b, be32(magic));
  append(b, be32(n));
  append(b, be32(rows));
  append(b, be32(cols));
  for (size_t i = 0; i < payload; ++i) b.push_back(uint8_t(i * 7));
  return b;
}

std::vector<uint8_t> labels(uint32_t magic, uint32_t n, const std::vector<uint8_t>& values) {
  std::vector<uint8_t> b;
  append(b, be32(magic));
  append(b, be32(n));
  append(b, values);
  return b;
}

void write_plain(const std::string& p, const std::vector<uint8_t>& data) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

void write_gz(const std::string& p, const std::vector<uint8_t>& data) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, data.data(), static_cast<unsigned>(data.size())) ==
          static_cast<int>(data.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::string error_of(const std::string& images_path, const std::string& labels_path) {
  try {
    load_idx_pair(images_path, labels_path, 10);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the installed Fashion-MNIST loads with the documented sizes and statistics") {
  const char* dir = distopt::test::kFashionMnistDir;
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  auto ds = load_fashion_mnist(dir);
  CHECK(ds.train.count == 60000);
  CHECK(ds.test.count == 10000);
  CHECK(ds.train.rows == 28);
  CHECK(ds.train.cols == 28);
  CHECK(ds.train.pixels.size() == 60000u * 784u);
  CHECK(ds.test.labels.size() == 10000u);
  double sum = 0, sq = 0;
  for (uint8_t p : ds.train.pixels) {
    sum += p / 255.0;
    sq += (p / 255.0) * (p / 255.0);
  }
  double n = static_cast<double>(ds.train.pixels.size());
  double mean = sum / n;
  double stdev = std::sqrt(sq / n - mean * mean);
  CHECK(mean == doctest::Approx(distopt::train::kFashionMnistMean).epsilon(0.001));
  CHECK(stdev == doctest::Approx(distopt::train::kFashionMnistStd).epsilon(0.001));
  std::vector<int> per_class(10, 0);
  for (uint8_t l : ds.train.labels) per_class.at(l)++;
  for (int c : per_class) CHECK(c == 6000);  // Fashion-MNIST is balanced
}

TEST_CASE("gzip and plain IDX files load alike") {
  TempDir t;
  auto img = images(0x803, 3, 2, 2, 12);
  auto lab = labels(0x801, 3, {0, 9, 4});
  write_gz(t.path + "/i.gz", img);
  write_plain(t.path + "/i", img);
  write_gz(t.path + "/l.gz", lab);
  write_plain(t.path + "/l", lab);
  auto a = load_idx_pair(t.path + "/i.gz", t.path + "/l.gz", 10);
  auto b = load_idx_pair(t.path + "/i", t.path + "/l", 10);
  CHECK(a.count == 3);
  CHECK(a.rows == 2);
  CHECK(a.pixels == b.pixels);
  CHECK(a.labels == std::vector<uint8_t>{0, 9, 4});
  CHECK(a.pixels[5] == uint8_t(35));
}

TEST_CASE("malformed IDX files give an error naming the file and the problem") {
  TempDir t;
  const std::string good_i = t.path + "/good_i", good_l = t.path + "/good_l";
  write_plain(good_i, images(0x803, 2, 2, 2, 8));
  write_plain(good_l, labels(0x801, 2, {1, 2}));
  REQUIRE(error_of(good_i, good_l).empty());

  struct Case {
    const char* name;
    std::vector<uint8_t> data;
    bool is_images;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"bad_magic_i", images(0x801, 2, 2, 2, 8), true, "magic 0x00000801"},
      {"short_header_i", {0, 0, 8}, true, "shorter than the 16-byte header"},
      {"truncated_i", images(0x803, 2, 2, 2, 7), true, "holds 7 bytes of pixels"},
      {"too_long_i", images(0x803, 2, 2, 2, 9), true, "holds 9 bytes of pixels"},
      {"bad_magic_l", labels(0x803, 2, {1, 2}), false, "magic 0x00000803"},
      {"count_mismatch_l", labels(0x801, 3, {1, 2, 3}), false, "3 labels for 2 images"},
      {"truncated_l", labels(0x801, 2, {1}), false, "holds 1"},
      {"label_range_l", labels(0x801, 2, {1, 10}), false, "label 10 at index 1"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string path = t.path + "/" + c.name;
    write_plain(path, c.data);
    std::string err = c.is_images ? error_of(path, good_l) : error_of(good_i, path);
    CHECK(err.find(path) != std::string::npos);
    CHECK(err.find(c.expect) != std::string::npos);
  }

  SUBCASE("a truncated gzip stream") {
    std::vector<uint8_t> big = images(0x803, 100, 28, 28, 100 * 784);
    write_gz(t.path + "/whole.gz", big);
    std::ifstream f(t.path + "/whole.gz", std::ios::binary);
    std::vector<uint8_t> gz((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    gz.resize(gz.size() / 2);
    const std::string path = t.path + "/cut.gz";
    write_plain(path, gz);
    std::string err = error_of(path, good_l);
    CHECK(err.find(path) != std::string::npos);
    CHECK(err.find("malformed") != std::string::npos);
  }
}

TEST_CASE("a directory without the files names the first missing one") {
  TempDir t;
  try {
    load_fashion_mnist(t.path);
    FAIL("expected DataError");
  } catch (const DataError& e) {
    std::string msg = e.what();
    CHECK(msg.find(t.path + "/train-images-idx3-ubyte.gz") != std::string::npos);
    CHECK(msg.find("missing") != std::string::npos);
  }
}
