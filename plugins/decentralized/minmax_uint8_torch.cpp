#include "minmax_uint8_torch.hpp"

#include <ATen/core/grad_mode.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace distopt::plugins::decentralized {
namespace {

constexpr double kLevels = 255.0;

int64_t chunks_of(int64_t n, int64_t chunk) {
  if (chunk <= 0) throw std::invalid_argument("minmax_uint8: chunk size " + std::to_string(chunk));
  return (n + chunk - 1) / chunk;
}

void check(const at::Tensor& x, const at::Tensor& bytes, int64_t chunk) {
  const int64_t n = x.numel(), c = chunks_of(n, chunk);
  if (x.scalar_type() != at::kFloat || x.dim() != 1 || !x.is_contiguous())
    throw std::invalid_argument("minmax_uint8: the values must be 1-D contiguous float32");
  if (bytes.scalar_type() != at::kByte || bytes.dim() != 1 || !bytes.is_contiguous() ||
      bytes.numel() != 8 * c + n)
    throw std::invalid_argument("minmax_uint8: the message must be 1-D contiguous uint8 of " +
                                std::to_string(8 * c + n) + " bytes");
  if (x.device() != bytes.device())
    throw std::invalid_argument("minmax_uint8: values on " + x.device().str() + ", message on " +
                                bytes.device().str());
}

// A float64 0-dim tensor on `like`'s device: dividing by it is a true
// division on every device (CUDA turns a division by a host scalar into a
// multiplication by its reciprocal).
at::Tensor device_scalar(double v, const at::Tensor& like) {
  return at::full({}, v, at::TensorOptions().dtype(at::kDouble).device(like.device()));
}

}  // namespace

void minmax_uint8_encode_torch(const at::Tensor& x, int64_t chunk, const at::Tensor& out) {
  check(x, out, chunk);
  at::NoGradGuard ng;
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t c = chunks_of(n, chunk);
  // [C, chunk]; the last chunk's tail repeats its first element, which
  // changes neither its min, max nor finiteness (its codes are dropped).
  at::Tensor rows = x;
  if (c * chunk != n) {
    rows = at::empty({c * chunk}, x.options());
    rows.narrow(0, 0, n).copy_(x);
    rows.narrow(0, n, c * chunk - n).copy_(x.narrow(0, (c - 1) * chunk, 1).expand({c * chunk - n}));
  }
  rows = rows.view({c, chunk});
  const at::Tensor finite = at::isfinite(rows).all(1);  // [C]
  const at::Tensor nan = at::full({}, std::numeric_limits<float>::quiet_NaN(), x.options());
  const at::Tensor lo = at::where(finite, rows.amin(1), nan);
  const at::Tensor hi = at::where(finite, rows.amax(1), nan);
  out.narrow(0, 0, 8 * c).view(at::kFloat).view({c, 2}).copy_(at::stack({lo, hi}, 1));

  const at::Tensor lo_d = lo.to(at::kDouble), span = hi.to(at::kDouble) - lo_d;  // [C]
  const at::Tensor coded = finite.logical_and(span != 0);                        // others: codes 0
  // scale = 255 / span (a true division; NaN or inf on rows not coded)
  const at::Tensor scale = at::div(device_scalar(kLevels, x), span);
  at::Tensor pos = (rows.to(at::kDouble) - lo_d.unsqueeze(1)) * scale.unsqueeze(1) + 0.5;
  pos = at::where(coded.unsqueeze(1), pos, at::zeros({}, pos.options()));
  // pos >= 0: truncation is the host's static_cast<int32_t>.
  const at::Tensor codes = pos.to(at::kInt).clamp_max_(255).to(at::kByte).view({-1});
  out.narrow(0, 8 * c, n).copy_(codes.narrow(0, 0, n));
}

void minmax_uint8_decode_torch(const at::Tensor& in, int64_t chunk, const at::Tensor& x) {
  check(x, in, chunk);
  at::NoGradGuard ng;
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t c = chunks_of(n, chunk);
  const at::Tensor header = in.narrow(0, 0, 8 * c).view(at::kFloat).view({c, 2}).to(at::kDouble);
  const at::Tensor lo = header.select(1, 0), span = header.select(1, 1) - lo;  // [C]
  // table[k][code] = float(lo + (code * span) / 255), op by op as the host's level().
  const at::Tensor code = at::arange(256, header.options()).unsqueeze(0);  // [1, 256]
  const at::Tensor table =
      at::add(lo.unsqueeze(1), at::div(code * span.unsqueeze(1), device_scalar(kLevels, x)))
          .to(at::kFloat)
          .view({-1});  // [C * 256]
  // index = chunk * 256 + code, per element
  at::Tensor index = at::zeros({c * chunk}, in.options().dtype(at::kInt));
  index.narrow(0, 0, n).copy_(in.narrow(0, 8 * c, n));
  index = index.view({c, chunk})
              .add_(at::arange(c, index.options()).mul_(256).unsqueeze(1))
              .view({-1})
              .narrow(0, 0, n);
  at::Tensor out = x;  // the same tensor: index_select_out takes a non-const handle
  at::index_select_out(out, table, 0, index);
}

}  // namespace distopt::plugins::decentralized
