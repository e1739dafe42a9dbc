// Bucket planning (torch-free, so it is unit-testable on its own): which
// parameter goes into which gradient bucket, at which offset.
//
// Rules (DDP's compute_bucket_assignment_by_size and Bagua's Reducer):
//  - parameters are taken in REVERSE registration order, the order in which
//    backward produces their gradients;
//  - a bucket holds one dtype; each dtype fills its own open bucket;
//  - an entry's byte offset is a multiple of lcm(align_bytes, element size);
//  - a bucket is closed when the next entry would take it past cap_bytes
//    (an entry bigger than the cap gets a bucket of its own); cap 0 means one
//    parameter per bucket;
//  - the flat buffer's length is padded to the alignment too;
//  - buckets are numbered by the position of their first entry in that
//    reverse order, i.e. in the order backward completes them;
//  - parameters of a unit (parameter sharding, PlanInput::unit >= 0) get one
//    bucket per unit and dtype, whatever the cap, shared with no other
//    parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace distopt::optim {

struct PlanInput {
  size_t numel = 0;
  size_t element_size = 4;  ///< bytes per element
  int dtype = 0;            ///< any code identifying the dtype (buckets never mix codes)
  int unit = -1;            ///< the unit it belongs to (parameter sharding); -1: none
};

struct PlannedEntry {
  size_t param = 0;   ///< index into the PlanInput vector
  size_t offset = 0;  ///< in elements from the start of the bucket
  size_t numel = 0;
};

struct PlannedBucket {
  int dtype = 0;
  int unit = -1;  ///< the unit whose parameters it holds, or -1
  size_t element_size = 4;
  size_t length = 0;  ///< elements, including alignment padding
  std::vector<PlannedEntry> entries;
  size_t bytes() const { return length * element_size; }
};

/// Plan the buckets of `params` (in registration order). align_bytes >= 1.
/// Throws std::invalid_argument for align_bytes < 1 or element_size 0.
std::vector<PlannedBucket> plan_buckets(const std::vector<PlanInput>& params, double cap_bytes,
                                        size_t align_bytes);

}  // namespace distopt::optim
