// optim::StoragePool (core/src/optim/storage.hpp): freed CPU blocks come back
// for requests that fit (up to slack_bytes smaller), at most max_blocks are
// kept (the oldest goes first), and clear() drops them.
#include <ATen/ATen.h>

#include "optim/storage.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::optim::free_storage;
using distopt::optim::storage_bytes;
using distopt::optim::StoragePool;

// A float tensor of `numel` elements whose storage holds no memory yet.
at::Tensor empty_storage(int64_t numel) {
  at::Tensor t = at::empty({numel}, at::kFloat);
  free_storage(t);
  return t;
}

}  // namespace

TEST_CASE("StoragePool: a released block serves the next request that fits") {
  StoragePool pool(4);
  at::Tensor a = empty_storage(1000);
  pool.allocate(a, 4000);
  REQUIRE(storage_bytes(a) == 4000);
  a.fill_(3);
  const void* block = a.data_ptr();
  pool.release(a);
  CHECK(storage_bytes(a) == 0);
  CHECK(pool.kept_bytes() == 4000);

  // 100 bytes less than the block: within the slack, the same memory.
  at::Tensor b = empty_storage(975);
  pool.allocate(b, 3900);
  CHECK(b.data_ptr() == block);
  CHECK(storage_bytes(b) == 4000);  // the storage holds the whole block
  CHECK(pool.kept_bytes() == 0);

  // Much smaller: a block of its own from the allocator.
  pool.release(b);
  at::Tensor c = empty_storage(100);
  pool.allocate(c, 400);
  CHECK(c.data_ptr() != block);
  CHECK(storage_bytes(c) == 400);
  CHECK(pool.kept_bytes() == 4000);
  // Larger than any kept block: also fresh.
  at::Tensor d = empty_storage(2000);
  pool.allocate(d, 8000);
  CHECK(storage_bytes(d) == 8000);
  CHECK(pool.kept_bytes() == 4000);
  pool.clear();
  CHECK(pool.kept_bytes() == 0);
}

TEST_CASE("StoragePool: at most max_blocks are kept, the oldest dropped") {
  StoragePool pool(2);
  std::vector<at::Tensor> ts;
  for (int64_t n : {100, 200, 300}) {
    ts.push_back(empty_storage(n));
    pool.allocate(ts.back(), static_cast<size_t>(n) * 4);
  }
  for (auto& t : ts) pool.release(t);
  CHECK(pool.kept_bytes() == 200 * 4 + 300 * 4);  // the 400-byte block went first

  StoragePool none(0);
  at::Tensor t = empty_storage(10);
  none.allocate(t, 40);
  none.release(t);
  CHECK(storage_bytes(t) == 0);
  CHECK(none.kept_bytes() == 0);
}

TEST_CASE("StoragePool: a storage that already holds enough keeps its memory") {
  StoragePool pool(4);
  at::Tensor t = at::ones({64});
  const void* before = t.data_ptr();
  pool.allocate(t, 64 * 4);
  CHECK(t.data_ptr() == before);
  CHECK(t.sum().item<float>() == 64);
}
