// The host's gradient bucketing defaults: the reducer section's bucketing
// options (`reducer: {options: {bucket_cap_mb, align_bytes, overlap}}`, read
// by the host's bucket manager, never by the reducer). Written once here;
// the option specs, the bucket manager, autotuning and the reference use
// them.
#pragma once

#include <cstdint>

namespace distopt {

/// MiB per gradient bucket: PyTorch DDP's bucket_cap_mb default.
inline constexpr double kDefaultBucketCapMb = 25;
/// Bytes each parameter's gradient is aligned to inside a bucket.
inline constexpr int64_t kDefaultAlignBytes = 8;
/// Reduce each bucket during backward as soon as it is full (else all in step()).
inline constexpr bool kDefaultOverlap = true;

}  // namespace distopt
