// JSON-lines metrics writer.
#include "train/metrics.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "distopt/error.hpp"

namespace distopt::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) throw Error("cannot open metrics file " + path + ": " + std::strerror(errno));
}

void MetricsWriter::write(const nlohmann::json& obj) {
  if (!out_.is_open()) return;
  out_ << obj.dump() << '\n';
  out_.flush();
  if (!out_) throw Error("cannot write metrics file " + path_);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace distopt::train
