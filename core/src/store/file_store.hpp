// file:// rendezvous store: one file per key in a directory shared by the ranks.
#pragma once

#include <string>

#include "distopt/store.hpp"

namespace distopt::store {

/// Values are written to a temporary file and renamed into place, so a reader
/// sees either no key or the whole value; add() serialises through flock on a
/// lock file. get() polls the directory until the key appears.
class FileStore : public Store {
 public:
  FileStore(const std::string& dir, std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  using Store::set;

 private:
  std::string path_of(const std::string& key) const;
  bool read_file(const std::string& path, std::vector<uint8_t>& out) const;
  std::string dir_;
  std::chrono::milliseconds timeout_;
};

}  // namespace distopt::store
