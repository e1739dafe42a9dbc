// orthogonalize_columns_generic (libtorch ops: what CUDA buckets run) against
// the CPU loop orthogonalize_columns, on host tensors: random matrices to
// float tolerance, exact zero columns for dependent ones (a zero column, a
// duplicated column), orthonormal columns, any strides.
#include "orthogonalize.hpp"  // plugins/powersgd

#include <ATen/ATen.h>

#include "torch_doctest.hpp"

namespace {

namespace ps = distopt::plugins::powersgd;

at::Tensor loop_version(const at::Tensor& a) {
  at::Tensor c = a.contiguous().clone();
  if (c.scalar_type() == at::kDouble)
    ps::orthogonalize_columns(c.data_ptr<double>(), c.size(0), c.size(1));
  else
    ps::orthogonalize_columns(c.data_ptr<float>(), c.size(0), c.size(1));
  return c;
}

at::Tensor generic_version(const at::Tensor& a) {
  at::Tensor c = a.clone();
  ps::orthogonalize_columns_generic(c);
  return c;
}

double max_diff(const at::Tensor& x, const at::Tensor& y) {
  return (x.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("generic Gram-Schmidt equals the CPU loop to float tolerance; orthonormal columns") {
  at::manual_seed(3);
  for (auto dt : {at::kFloat, at::kDouble}) {
    const double tol = dt == at::kFloat ? 1e-5 : 1e-12;
    for (auto shape :
         std::vector<std::pair<int64_t, int64_t>>{{50, 4}, {7, 7}, {300, 16}, {1, 1}}) {
      CAPTURE(shape.first);
      CAPTURE(shape.second);
      CAPTURE(dt);
      at::Tensor a = at::randn({shape.first, shape.second}, at::TensorOptions().dtype(dt));
      at::Tensor g = generic_version(a), l = loop_version(a);
      CHECK(max_diff(g, l) <= tol);
      at::Tensor gram = g.t().mm(g).to(at::kDouble);
      CHECK(max_diff(gram, at::eye(shape.second, at::kDouble)) <= 100 * tol);
    }
  }
}

TEST_CASE("generic Gram-Schmidt zeroes dependent columns exactly, as the loop does") {
  for (auto dt : {at::kFloat, at::kDouble}) {
    CAPTURE(dt);
    at::Tensor a = at::randn({20, 5}, at::TensorOptions().dtype(dt));
    a.select(1, 1).zero_();                    // an all-zero gradient column
    a.select(1, 3).copy_(a.select(1, 0) * 2);  // dependent on column 0
    at::Tensor g = generic_version(a), l = loop_version(a);
    for (int64_t j : {1, 3}) {
      CAPTURE(j);
      CHECK(g.select(1, j).abs().max().item<double>() == 0.0);
      CHECK(l.select(1, j).abs().max().item<double>() == 0.0);
    }
    CHECK(max_diff(g, l) <= (dt == at::kFloat ? 1e-5 : 1e-12));
    CHECK(g.select(1, 4).norm().item<double>() == doctest::Approx(1.0).epsilon(1e-6));
  }
}

TEST_CASE("generic Gram-Schmidt works in place on strided views") {
  at::Tensor base = at::randn({6, 30}, at::kFloat);
  at::Tensor view = base.t();  // 30 x 6, column-major storage
  at::Tensor expect = generic_version(view.contiguous());
  ps::orthogonalize_columns_generic(view);
  CHECK(max_diff(base.t(), expect) == 0.0);
  CHECK(max_diff(base.t(), loop_version(base.t())) <= 1e-5);
}
