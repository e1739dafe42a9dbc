// Freeing and re-allocating a tensor's memory in place (parameter sharding):
// every view of the storage, the autograd graph's saved tensors included,
// sees the memory go and come back, as FSDP's storage().resize_(0). Device
// generic: the storage's own allocator (CPU, or CUDA's caching allocator).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <cstddef>

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

}  // namespace distopt::optim
