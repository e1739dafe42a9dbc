// Durable file writes for checkpoints: write to a temporary name in the same
// directory, fsync the file, rename over the target, fsync the directory. A
// crash at any point leaves either the old file or the new one, never a mix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distopt::checkpoint {

/// Atomically replace `path` with `bytes`. Throws CheckpointError naming the
/// path and errno's text. Test-only: when `die_halfway` is true the process
/// writes half of the temporary file and _exit(137)s (a rank killed mid-save).
void write_atomic(const std::string& path, const std::vector<char>& bytes,
                  bool die_halfway = false);

/// The whole file. Throws CheckpointError naming the path.
std::vector<char> read_file(const std::string& path);

/// zlib's CRC-32 of the bytes.
uint32_t crc32_of(const std::vector<char>& bytes);

/// fsync a directory (after creating or renaming entries in it).
void sync_dir(const std::string& dir);

}  // namespace distopt::checkpoint
