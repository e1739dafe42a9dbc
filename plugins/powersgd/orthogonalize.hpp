// Orthonormalising the columns of PowerSGD's P (and Q) matrices.
//
// Every rank orthogonalises the same allreduced P and must get the same bits,
// so the CPU kernel is a plain loop rather than a BLAS/LAPACK QR whose
// blocking may depend on the thread count. The device-generic version
// (orthogonalize_columns_generic) is the same Gram-Schmidt written with
// libtorch ops, for P and Q on any device (CUDA): same rule for dependent
// columns, float-tolerance equal to the loop (classical rather than modified
// projections, library reductions), and deterministic on one kind of device,
// so all ranks still get the same bits.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

namespace distopt::plugins::powersgd {

/// Orthonormalise in place the `cols` columns of the row-major `rows` x `cols`
/// matrix `a` (Gram-Schmidt with re-orthogonalisation, left to right, double accumulation). A
/// column whose norm after removing the earlier columns is not above `tiny` times its norm before
/// (a linearly dependent column, e.g. of an all-zero gradient) is set to zero instead of being
/// divided by ~0: it then adds nothing to P P^T M, which is exact for such a column. Needs rows >=
/// cols for a full basis. Deterministic: same input bits, same output bits. Thread-safe (no state).
void orthogonalize_columns(float* a, int64_t rows, int64_t cols, double tiny = 1e-6);
void orthogonalize_columns(double* a, int64_t rows, int64_t cols, double tiny = 1e-12);

/// The same on a rows x cols float32 / float64 tensor `a` (any device, any
/// strides; written in place): Gram-Schmidt column by column in float64
/// with two projection passes against the earlier columns (as stored in a's
/// dtype), a dependent column (norm after <= tiny x norm before, or not
/// finite) set to zero; tiny = 1e-6 for float32, 1e-12 for float64. No host
/// sync (the dependent-column test is a device-side select). Deterministic
/// on a given device and library build. Thread-safe (no state).
void orthogonalize_columns_generic(at::Tensor a);

}  // namespace distopt::plugins::powersgd
