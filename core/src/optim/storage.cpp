// StoragePool: freed CPU blocks kept for reuse (optim/storage.hpp).
#include "optim/storage.hpp"

namespace distopt::optim {

void StoragePool::allocate(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() >= nbytes && s->data() != nullptr) return;
  if (s->device().is_cpu()) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->first < nbytes || it->first > nbytes + slack_bytes) continue;
      const size_t bytes = it->first;
      s->set_data_ptr_noswap(std::move(it->second));
      s->set_nbytes(bytes);
      kept_.erase(it);
      return;
    }
  }
  allocate_storage(t, nbytes);
}

void StoragePool::release(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (!s->device().is_cpu() || s->data() == nullptr || max_blocks_ == 0) {
    free_storage(t);
    return;
  }
  const size_t bytes = s->nbytes();
  at::DataPtr block = s->set_data_ptr(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
  std::lock_guard<std::mutex> lk(mu_);
  if (kept_.size() == max_blocks_) kept_.pop_front();
  kept_.emplace_back(bytes, std::move(block));
}

void StoragePool::clear() {
  std::deque<std::pair<size_t, at::DataPtr>> drop;
  {
    std::lock_guard<std::mutex> lk(mu_);
    drop.swap(kept_);
  }
}

size_t StoragePool::kept_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& k : kept_) n += k.first;
  return n;
}

}  // namespace distopt::optim
