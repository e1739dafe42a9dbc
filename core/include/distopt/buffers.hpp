// Buffer synchronisation modes (`buffers.sync` in the job file,
// DistributedOptimizer::set_buffers in C++).
#pragma once

#include <string>

namespace distopt {

/// `buffers.sync`: how module buffers (BatchNorm running statistics, ...)
/// are made equal on every rank at the end of every step(). One collective
/// per step for all buffers together, whatever their number:
///   broadcast  rank 0's buffers (PyTorch DDP's broadcast_buffers=True)
///   average    floating-point buffers averaged over ranks (Horovod, Bagua);
///              integer buffers (num_batches_tracked) from rank 0
///   none       left as each rank computed them
enum class BufferSync { broadcast, average, none };
/// "broadcast" | "average" | "none".
const char* buffer_sync_name(BufferSync s);
/// The inverse; throws ConfigError for another name.
BufferSync parse_buffer_sync(const std::string& name);

}  // namespace distopt
