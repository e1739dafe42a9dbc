// The min-max uint8 codec on libtorch ops (plugins/decentralized/
// minmax_uint8_torch.hpp, what low_precision runs on device buffers), here on
// CPU tensors, against the host codec (minmax_uint8.hpp): the same bytes
// from the encoder, bitwise the same floats from the decoder, on lengths
// that do not divide into chunks, constant and non-finite chunks, values of
// very different scales, and empty input.
#include "minmax_uint8_torch.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "minmax_uint8.hpp"
#include "torch_doctest.hpp"

using namespace distopt::plugins::decentralized;

namespace {

at::Tensor host_encode(const at::Tensor& x, int64_t chunk) {
  at::Tensor out = at::empty(
      {static_cast<int64_t>(minmax_uint8_bytes(static_cast<size_t>(x.numel()), chunk))}, at::kByte);
  minmax_uint8_encode(x.data_ptr<float>(), static_cast<size_t>(x.numel()), chunk,
                      out.data_ptr<uint8_t>());
  return out;
}

at::Tensor host_decode(const at::Tensor& in, int64_t n, int64_t chunk) {
  at::Tensor x = at::full({n}, -7.0f);
  minmax_uint8_decode(in.data_ptr<uint8_t>(), static_cast<size_t>(n), chunk, x.data_ptr<float>());
  return x;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Both encoders and both decoders on x; returns the host round trip.
at::Tensor check_same(const at::Tensor& x, int64_t chunk) {
  CAPTURE(x.numel());
  CAPTURE(chunk);
  const at::Tensor bytes = host_encode(x, chunk);
  at::Tensor mine = at::full_like(bytes, 0xAB);
  minmax_uint8_encode_torch(x, chunk, mine);
#if defined(__FP_FAST_FMA)
  // A build that contracts the host encoder's (x - lo) * scale + 0.5 into an
  // FMA may round a value at a half level the other way: one level apart.
  CHECK((mine.to(at::kInt) - bytes.to(at::kInt)).abs().max().item<int>() <= 1);
#else
  CHECK(same_bits(mine, bytes));
#endif
  const at::Tensor want = host_decode(bytes, x.numel(), chunk);
  at::Tensor got = at::full({x.numel()}, 5.0f);
  minmax_uint8_decode_torch(bytes, chunk, got);
  CHECK(same_bits(got, want));
  return want;
}

}  // namespace

TEST_CASE("the torch codec writes and reads the host codec's bytes") {
  at::manual_seed(3);
  for (int64_t chunk : {1, 7, 256, 1024}) {
    for (int64_t n : {1, 5, 255, 1024, 1025, 3000}) {
      at::Tensor x = at::randn({n}) * 3 + 1;
      const at::Tensor y = check_same(x, chunk);
      // The codec is lossy but close: within half a level of the widest chunk.
      const double range = (x.max() - x.min()).item<double>();
      CHECK((y - x).abs().max().item<double>() <= range / 510 + 1e-6);
    }
  }
}

TEST_CASE("scales, constant and non-finite chunks, empty input") {
  at::manual_seed(4);
  const int64_t chunk = 64;
  at::Tensor x = at::randn({6 * chunk + 10});
  x.narrow(0, 0, chunk).mul_(1e-30);          // tiny values
  x.narrow(0, chunk, chunk).mul_(1e30);       // huge values
  x.narrow(0, 2 * chunk, chunk).fill_(0.3f);  // constant: exact
  x[3 * chunk + 5].fill_(std::numeric_limits<float>::infinity());
  x[4 * chunk + 1].fill_(std::numeric_limits<float>::quiet_NaN());
  x.narrow(0, 5 * chunk, chunk).add_(1e6);  // large offset, small spread
  const at::Tensor y = check_same(x, chunk);
  CHECK(at::equal(y.narrow(0, 2 * chunk, chunk), x.narrow(0, 2 * chunk, chunk)));
  CHECK(y.narrow(0, 3 * chunk, chunk).isnan().all().item<bool>());
  CHECK(y.narrow(0, 4 * chunk, chunk).isnan().all().item<bool>());
  CHECK(y.narrow(0, 0, 3 * chunk).isfinite().all().item<bool>());
  check_same(at::empty({0}), chunk);
}

TEST_CASE("the torch codec refuses bad arguments") {
  at::Tensor x = at::zeros({10});
  at::Tensor out = at::zeros({static_cast<int64_t>(minmax_uint8_bytes(10, 4))}, at::kByte);
  CHECK_THROWS_AS(minmax_uint8_encode_torch(x, 0, out), std::invalid_argument);
  CHECK_THROWS_AS(minmax_uint8_encode_torch(x, 5, out), std::invalid_argument);  // wrong size
  CHECK_THROWS_AS(minmax_uint8_decode_torch(out, 4, x.to(at::kDouble)), std::invalid_argument);
  CHECK_NOTHROW(minmax_uint8_encode_torch(x, 4, out));
}
