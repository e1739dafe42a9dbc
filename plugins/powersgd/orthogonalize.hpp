// Orthonormalising the columns of PowerSGD's P (and Q) matrices.
//
// Every rank orthogonalises the same allreduced P and must get the same bits,
// so this is a plain loop rather
// than a BLAS/LAPACK QR whose blocking may depend on the thread count.
// Torch-free.
#pragma once

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

}  // namespace distopt::plugins::powersgd
