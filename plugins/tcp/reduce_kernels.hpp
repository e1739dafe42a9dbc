// Element-wise reductions for the dtypes `tcp` supports. bfloat16 and
// float16 are widened to float for the arithmetic and rounded back
// (round-to-nearest-even), so every ring step rounds once.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>

#include "distopt/communicator.h"

namespace distopt::plugins::tcp {

enum class DType { F32, F64, BF16, F16, I32, I64 };

/// Map a DLPack dtype (lanes must be 1) to ours; false if unsupported.
bool dtype_from_dl(DLDataType t, DType* out);
size_t dtype_size(DType t);
const char* dtype_name(DType t);

/// dst[i] = a[i] (op) b[i] for i < n; then, if divisor > 1, dst[i] /= divisor
/// (the final step of an average; integer types truncate toward zero).
/// dst may alias a or b exactly (in-place); other overlaps are not allowed.
/// DOPT_REDUCE_AVG must be passed as DOPT_REDUCE_SUM plus a divisor.
void reduce(DType t, dopt_reduce_op op, void* dst, const void* a, const void* b, size_t n,
            int divisor);

/// dst[i] = src[i] / divisor (world-size-1 average; only used when divisor > 1).
void divide(DType t, void* dst, const void* src, size_t n, int divisor);

}  // namespace distopt::plugins::tcp
