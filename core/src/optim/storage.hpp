// Freeing and re-allocating a tensor's memory in place (parameter sharding):
// every view of the storage, the autograd graph's saved tensors included,
// sees the memory go and come back, as FSDP's storage().resize_(0). Device
// generic: the storage's own allocator (CPU, or CUDA's caching allocator).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

namespace distopt::optim {

/// Bytes `t`'s storage holds now (0 once freed).
inline size_t storage_bytes(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.storage().nbytes() : 0;
}

/// Drop `t`'s memory; every tensor sharing its storage then has none (reading
/// it is undefined: callers point the tensors users see elsewhere first).
inline void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

/// Give `t`'s storage `nbytes` of fresh (uninitialised) memory from its own
/// allocator, unless it already holds that much. Throws c10::Error when the
/// allocator fails (out of memory).
inline void allocate_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() >= nbytes && s->data() != nullptr) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

/// Freed CPU blocks kept for the next allocation of the same size (parameter
/// sharding frees and gathers every unit, and every unit's gradient bucket,
/// each step: memory the allocator handed back to the OS costs a page
/// fault and a kernel zeroing per 4 KiB page when it is touched again).
/// A block fits a request of up to `slack_bytes` less than its size (a
/// unit's gradient bucket and its full parameter buffer, padded to a
/// multiple of the world size, share blocks). At most `max_blocks` are kept
/// (the oldest goes first); clear() drops them all. Since an
/// allocation takes a kept block before the allocator's, kept and used
/// blocks of one size never add up to more than the most used at once.
/// Other devices go straight to their allocator (CUDA's caching allocator
/// reuses blocks itself). Thread safe.
class StoragePool {
 public:
  static constexpr size_t slack_bytes = 256;
  explicit StoragePool(size_t max_blocks) : max_blocks_(max_blocks) {}
  /// allocate_storage(t, nbytes), from a kept block when one fits (the
  /// storage then holds the block's size, at most nbytes + slack_bytes).
  void allocate(const at::Tensor& t, size_t nbytes);
  /// free_storage(t), keeping its block (CPU).
  void release(const at::Tensor& t);
  /// Drop every kept block.
  void clear();
  /// Bytes of the kept blocks.
  size_t kept_bytes() const;

 private:
  mutable std::mutex mu_;
  size_t max_blocks_;
  std::deque<std::pair<size_t, at::DataPtr>> kept_;  // (bytes, block), oldest first
};

}  // namespace distopt::optim
