// JSON-lines metrics of `distopt train` (--metrics FILE) and number formatting
// shared by its console output. Torch-free.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace distopt::train {

/// Writes one JSON object per line to a file (truncated on open, or
/// appended to: a resumed run continues its history). A default-constructed
/// writer is disabled and ignores writes. Not thread-safe.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// Open `path`: create or truncate it, or (append) create it or append to
  /// it. Throws distopt::Error naming the file.
  explicit MetricsWriter(const std::string& path, bool append = false);
  bool enabled() const { return out_.is_open(); }
  /// Write `obj` as one line and flush, so a crash later keeps what was written.
  /// Throws distopt::Error if the write fails.
  void write(const nlohmann::json& obj);

 private:
  std::string path_;
  std::ofstream out_;
};

/// "512 B", "2.10 MB", "1.35 GB" (decimal units, as bandwidths are quoted).
std::string format_bytes(double bytes);

}  // namespace distopt::train
