// IDX reader for Fashion-MNIST (http://yann.lecun.com/exdb/mnist/ format).
#include "train/dataset.hpp"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace distopt::train {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

uint32_t be32(const std::vector<uint8_t>& b, size_t off) {
  return (uint32_t(b[off]) << 24) | (uint32_t(b[off + 1]) << 16) | (uint32_t(b[off + 2]) << 8) |
         uint32_t(b[off + 3]);
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// "<dir>/<base>.gz" if present, else "<dir>/<base>"; DataError if neither.
std::string locate(const std::string& dir, const std::string& base) {
  std::string gz = dir + "/" + base + ".gz";
  std::string plain = dir + "/" + base;
  if (is_file(gz)) return gz;
  if (is_file(plain)) return plain;
  throw DataError("Fashion-MNIST file missing: " + gz + " (nor " + plain +
                  "); install the Debian package dataset-fashion-mnist or pass --data DIR");
}

}  // namespace

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  if (!is_file(path)) throw DataError("data file missing: " + path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw DataError("cannot open data file " + path + ": " + std::strerror(errno));
  gzbuffer(f, 1 << 17);
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int k = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (k < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      throw DataError("malformed data file " + path + ": gzip error: " + msg);
    }
    if (k == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + k);
  }
  // gzread stops quietly at a truncated gzip stream; gzclose_r reports it.
  int rc = gzclose(f);
  if (rc != Z_OK)
    throw DataError("malformed data file " + path + ": truncated or corrupt gzip stream");
  return out;
}

ImageSet load_idx_pair(const std::string& images_path, const std::string& labels_path,
                       int num_classes) {
  ImageSet set;
  std::vector<uint8_t> img = read_maybe_gzip(images_path);
  if (img.size() < 16)
    throw DataError("malformed IDX image file " + images_path + ": " + std::to_string(img.size()) +
                    " bytes, shorter than the 16-byte header");
  if (be32(img, 0) != 0x00000803)
    throw DataError("malformed IDX image file " + images_path + ": magic " + hex(be32(img, 0)) +
                    ", expected 0x00000803 (uint8, 3 dimensions)");
  set.count = be32(img, 4);
  set.rows = be32(img, 8);
  set.cols = be32(img, 12);
  if (set.rows <= 0 || set.cols <= 0 || set.rows > 4096 || set.cols > 4096)
    throw DataError("malformed IDX image file " + images_path + ": implausible image size " +
                    std::to_string(set.rows) + "x" + std::to_string(set.cols));
  const uint64_t want = uint64_t(set.count) * uint64_t(set.rows) * uint64_t(set.cols);
  if (img.size() - 16 != want)
    throw DataError("malformed IDX image file " + images_path + ": header says " +
                    std::to_string(set.count) + " images of " + std::to_string(set.rows) + "x" +
                    std::to_string(set.cols) + " (" + std::to_string(want) +
                    " bytes) but the file holds " + std::to_string(img.size() - 16) +
                    " bytes of pixels");
  set.pixels.assign(img.begin() + 16, img.end());

  std::vector<uint8_t> lab = read_maybe_gzip(labels_path);
  if (lab.size() < 8)
    throw DataError("malformed IDX label file " + labels_path + ": " + std::to_string(lab.size()) +
                    " bytes, shorter than the 8-byte header");
  if (be32(lab, 0) != 0x00000801)
    throw DataError("malformed IDX label file " + labels_path + ": magic " + hex(be32(lab, 0)) +
                    ", expected 0x00000801 (uint8, 1 dimension)");
  const uint64_t nlab = be32(lab, 4);
  if (nlab != uint64_t(set.count))
    throw DataError("malformed IDX label file " + labels_path + ": " + std::to_string(nlab) +
                    " labels for " + std::to_string(set.count) + " images in " + images_path);
  if (lab.size() - 8 != nlab)
    throw DataError("malformed IDX label file " + labels_path + ": header says " +
                    std::to_string(nlab) + " labels but the file holds " +
                    std::to_string(lab.size() - 8));
  set.labels.assign(lab.begin() + 8, lab.end());
  for (size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] >= num_classes)
      throw DataError("malformed IDX label file " + labels_path + ": label " +
                      std::to_string(set.labels[i]) + " at index " + std::to_string(i) +
                      " is not below " + std::to_string(num_classes));
  return set;
}

std::string fashion_mnist_missing(const std::string& dir) {
  try {
    for (const char* base : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
      locate(dir, base);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

int64_t fashion_mnist_train_count(const std::string& dir) {
  const std::string path = locate(dir, "train-images-idx3-ubyte");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw DataError("cannot open data file " + path + ": " + std::strerror(errno));
  unsigned char h[8] = {};
  const int n = gzread(f, h, sizeof h);
  gzclose(f);
  if (n != static_cast<int>(sizeof h) || h[0] != 0 || h[1] != 0 || h[2] != 8 || h[3] != 3)
    throw DataError("malformed data file " + path + ": no IDX3 header");
  return (int64_t{h[4]} << 24) | (int64_t{h[5]} << 16) | (int64_t{h[6]} << 8) | int64_t{h[7]};
}

FashionMnist load_fashion_mnist(const std::string& dir) {
  FashionMnist ds;
  // Located one by one so the first missing file (in this order) is reported.
  const std::string train_images = locate(dir, "train-images-idx3-ubyte");
  const std::string train_labels = locate(dir, "train-labels-idx1-ubyte");
  const std::string test_images = locate(dir, "t10k-images-idx3-ubyte");
  const std::string test_labels = locate(dir, "t10k-labels-idx1-ubyte");
  ds.train = load_idx_pair(train_images, train_labels, FashionMnist::kNumClasses);
  ds.test = load_idx_pair(test_images, test_labels, FashionMnist::kNumClasses);
  if (ds.train.rows != ds.test.rows || ds.train.cols != ds.test.cols)
    throw DataError("Fashion-MNIST in " + dir + ": train images are " +
                    std::to_string(ds.train.rows) + "x" + std::to_string(ds.train.cols) +
                    " but test images are " + std::to_string(ds.test.rows) + "x" +
                    std::to_string(ds.test.cols));
  return ds;
}

}  // namespace distopt::train
