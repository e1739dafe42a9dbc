#include "orthogonalize.hpp"

#include <cmath>
#include <vector>

namespace distopt::plugins::powersgd {
namespace {

template <class T>
void gram_schmidt(T* a, int64_t rows, int64_t cols, double tiny) {
  std::vector<double> c(static_cast<size_t>(rows));
  for (int64_t j = 0; j < cols; ++j) {
    double before = 0;
    for (int64_t i = 0; i < rows; ++i) {
      c[i] = static_cast<double>(a[i * cols + j]);
      before += c[i] * c[i];
    }
    // Two projection passes ("twice is enough", Giraud et al. 2005): one
    // pass loses orthogonality in proportion to P's condition number, which
    // would keep rank >= min(n, m) from reproducing the mean exactly.
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k = 0; k < j; ++k) {
        double dot = 0;
        for (int64_t i = 0; i < rows; ++i) dot += static_cast<double>(a[i * cols + k]) * c[i];
        for (int64_t i = 0; i < rows; ++i) c[i] -= dot * static_cast<double>(a[i * cols + k]);
      }
    }
    double after = 0;
    for (int64_t i = 0; i < rows; ++i) after += c[i] * c[i];
    const double norm = std::sqrt(after);
    // Relative test: a dependent column keeps only rounding noise of its
    // original size, which normalising would blow up into a bogus direction.
    if (!std::isfinite(norm) || !(norm > 0) || !(norm > tiny * std::sqrt(before))) {
      for (int64_t i = 0; i < rows; ++i) a[i * cols + j] = T(0);
      continue;
    }
    const double inv = 1.0 / norm;
    for (int64_t i = 0; i < rows; ++i) a[i * cols + j] = static_cast<T>(c[i] * inv);
  }
}

}  // namespace

void orthogonalize_columns(float* a, int64_t rows, int64_t cols, double tiny) {
  gram_schmidt(a, rows, cols, tiny);
}
void orthogonalize_columns(double* a, int64_t rows, int64_t cols, double tiny) {
  gram_schmidt(a, rows, cols, tiny);
}

void orthogonalize_columns_generic(at::Tensor a) {
  const double tiny = a.scalar_type() == at::kDouble ? 1e-12 : 1e-6;
  const int64_t cols = a.size(1);
  // Finished columns as stored in a's dtype, widened (what the loop reads back).
  at::Tensor done = at::empty_like(a, a.options().dtype(at::kDouble));
  for (int64_t j = 0; j < cols; ++j) {
    at::Tensor c = a.select(1, j).to(at::kDouble);  // a copy
    at::Tensor before = c.dot(c);
    if (j > 0) {
      at::Tensor prev = done.narrow(1, 0, j);
      for (int pass = 0; pass < 2; ++pass)  // "twice is enough", as the loop
        c.sub_(prev.mv(prev.t().mv(c)));
    }
    at::Tensor norm = c.dot(c).sqrt();
    at::Tensor ok =
        at::isfinite(norm).logical_and(norm.gt(0)).logical_and(norm.gt(before.sqrt().mul(tiny)));
    at::Tensor col = at::where(ok, c.div(norm), at::zeros_like(c)).to(a.scalar_type());
    a.select(1, j).copy_(col);
    done.select(1, j).copy_(col);
  }
}

}  // namespace distopt::plugins::powersgd
