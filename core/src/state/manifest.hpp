// manifest.json of one checkpoint: what was saved, by whom, and how to check
// the shard files (size and CRC-32 each).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "distopt/checkpoint.hpp"
#include "distopt/precision.hpp"

namespace distopt::checkpoint {

struct ComponentRecord {
  std::string plugin, component, version, plugin_version;
  uint32_t abi_major = 0, abi_minor = 0;
  std::map<std::string, std::string> options;  ///< validated options, as text
};

struct ShardRecord {
  int rank = 0;
  std::string file;  ///< relative to the step directory
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct Manifest {
  int64_t step = 0;
  int world_size = 0;
  std::string host_abi;  ///< "1.1"
  ComponentRecord algorithm, reducer;
  std::string optimizer;
  std::vector<double> group_lr;  ///< per param group: the last set_lr, -1 = the config's
  std::map<std::string, std::string> optimizer_options;
  std::string precision;        ///< "fp32", "bf16", "fp16"
  bool has_loss_scale = false;  ///< the job had a loss scaler (precision: section)
  LossScaleState loss_scale;
  CheckpointExtra extra;
  /// The `schedule:` phase running when saved (-1: no schedule) and the last
  /// set_epoch; a resume switches to that phase before loading the state.
  int schedule_phase = -1;
  int64_t epoch = 0;
  double autotune_bucket_cap_mb = -1;  ///< autotuning's choice (-1: none)
  /// The rest of autotuning's choice (-1: none; manifests before they were
  /// tuned: the job's own setting).
  int autotune_overlap = -1, autotune_hierarchical = -1;
  std::vector<ShardRecord> shards;  ///< one per rank, in rank order

  std::string to_json() const;
  /// Parse and validate (format, one shard per rank). `file` is named in errors.
  static Manifest from_json(const std::string& text, const std::string& file);
  CheckpointInfo info(const std::string& path) const;
};

/// "rank-00001-of-00004.pt"
std::string shard_file_name(int rank, int world_size);

}  // namespace distopt::checkpoint
