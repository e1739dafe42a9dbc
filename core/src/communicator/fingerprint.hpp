// What one collective call is: kind, position in the communicator's sequence,
// element count, dtype, root and reduction. Ranks compare fingerprints to
// name a mismatch (PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks the same
// fields, before every collective; we compare only when a wait stalls).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "distopt/communicator.h"

namespace distopt::comm_check {

struct Fingerprint {
  uint64_t seq = 0;       ///< 1-based position among this communicator's collectives
  std::string kind;       ///< "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"
  uint64_t kind_seq = 0;  ///< 1-based position among collectives of this kind
  int64_t count = 0;      ///< elements of the send buffer (0 for barrier)
  DLDataType dtype{0, 0, 0};
  int32_t root = -1;  ///< broadcast only
  int32_t op = -1;    ///< dopt_reduce_op of reductions

  /// The fields every rank must agree on, as one comparable string.
  std::string signature() const;
  /// "allreduce #117 of 2.1 MB float32 (sum)".
  std::string describe() const;
  /// One line that decode() reads back.
  std::string encode() const;
  static std::optional<Fingerprint> decode(const std::string& line);
};

/// "float32", "bfloat16", "int64", ... ("dtype(code,bits)" for others).
std::string dtype_name(DLDataType t);
/// 4096 -> "4.1 kB", 2100000 -> "2.1 MB" (decimal units, as in the messages).
std::string human_bytes(uint64_t bytes);

}  // namespace distopt::comm_check
