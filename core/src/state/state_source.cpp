#include "state/state_source.hpp"

#include <algorithm>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::state {

namespace {

dopt_status find_cb(void* ctx, const char* key, int32_t* found, int32_t* kind, DLDataType* dtype,
                    int32_t* ndim, int64_t shape[8]) noexcept {
  auto* c = static_cast<const StateSource::ReaderCtx*>(ctx);
  try {
    if (!key || !found) throw CheckpointError("state find: NULL key or found");
    const std::string full = *c->prefix + key;
    *found = c->source->has(full) ? 1 : 0;
    if (!*found) return DOPT_OK;
    const StateEntry& e = c->source->first(full);
    if (kind) *kind = e.kind;
    if (dtype) *dtype = sdk::to_dl_dtype(e.data.scalar_type());
    if (ndim) *ndim = static_cast<int32_t>(e.shape.size());
    if (shape)
      for (size_t i = 0; i < e.shape.size() && i < 8; ++i) shape[i] = e.shape[i];
    return DOPT_OK;
  } catch (const std::exception& ex) {
    set_last_error(ex.what());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
}

dopt_status read_cb(void* ctx, const char* key, int64_t offset, DLTensor* out) noexcept {
  auto* c = static_cast<const StateSource::ReaderCtx*>(ctx);
  try {
    if (!key || !out) throw CheckpointError("state read: NULL key or out");
    const std::string full = *c->prefix + key;
    if (out->device.device_type != kDLCPU)
      throw CheckpointError("state read '" + full + "': output is not on the CPU");
    at::Tensor t = sdk::as_tensor(*out);
    if (!t.is_contiguous())
      throw CheckpointError("state read '" + full + "': output is not contiguous");
    c->source->read(full, offset, t.view({-1}));
    return DOPT_OK;
  } catch (const std::exception& ex) {
    set_last_error(ex.what());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
}

}  // namespace

StateSource::StateSource(std::vector<ShardState> shards, int rank, int world_size)
    : shards_(std::move(shards)), rank_(rank), world_size_(world_size) {
  for (size_t r = 0; r < shards_.size(); ++r)
    for (const StateEntry& e : shards_[r].entries()) {
      auto& pieces = index_[e.key];
      if (!pieces.empty()) {
        const StateEntry& f = *pieces.front().entry;
        if (f.kind != e.kind || f.shape != e.shape)
          throw CheckpointError("state '" + e.key + "': ranks " +
                                std::to_string(pieces.front().rank) + " and " + std::to_string(r) +
                                " saved it with a different kind or shape");
      }
      pieces.push_back({static_cast<int>(r), &e});
    }
}

std::vector<std::string> StateSource::keys(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = index_.lower_bound(prefix); it != index_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(it->first);
  }
  return out;
}

const StateEntry& StateSource::first(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) throw CheckpointError("checkpoint has no state '" + key + "'");
  return *it->second.front().entry;
}

at::Tensor StateSource::local(const std::string& key, int saved_rank) const {
  auto it = index_.find(key);
  if (it == index_.end()) return {};
  for (const Piece& p : it->second)
    if (p.rank == saved_rank) return p.entry->data;
  return {};
}

void StateSource::read(const std::string& key, int64_t offset, at::Tensor out) const {
  const StateEntry& f = first(key);
  const int64_t n = out.numel();
  const int64_t total = f.kind == DOPT_STATE_SHARDED ? f.logical_numel() : f.data.numel();
  if (offset < 0 || offset + n > total)
    throw CheckpointError("state '" + key + "': elements [" + std::to_string(offset) + ", " +
                          std::to_string(offset + n) + ") requested, it has " +
                          std::to_string(total));
  const auto& pieces = index_.at(key);
  if (f.kind == DOPT_STATE_RANK_LOCAL) {
    at::Tensor src;
    const int saved = saved_world_size();
    if (saved == world_size_) {
      src = local(key, rank_);
      if (!src.defined())
        throw CheckpointError("state '" + key + "': saved rank " + std::to_string(rank_) +
                              " has no value for it");
    } else if (at::isFloatingType(f.data.scalar_type())) {
      // Another world size: the mean keeps the average pending correction.
      at::Tensor sum = at::zeros({total}, at::kDouble);
      for (const Piece& p : pieces) sum.add_(p.entry->data.to(at::kDouble));
      src = sum.div_(static_cast<double>(pieces.size()));
    } else {
      src = local(key, rank_ % saved);
      if (!src.defined()) src = pieces.front().entry->data;
    }
    out.copy_(src.slice(0, offset, offset + n));
    return;
  }
  // SHARDED: copy overlapping pieces, highest rank first so the lowest wins.
  std::vector<std::pair<int64_t, int64_t>> covered;
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    const StateEntry& e = *it->entry;
    const int64_t a = std::max(offset, e.offset);
    const int64_t b = std::min(offset + n, e.offset + e.data.numel());
    if (a >= b) continue;
    out.slice(0, a - offset, b - offset).copy_(e.data.slice(0, a - e.offset, b - e.offset));
    covered.emplace_back(a, b);
  }
  std::sort(covered.begin(), covered.end());
  int64_t reach = offset;
  for (const auto& [a, b] : covered) {
    if (a > reach) break;
    reach = std::max(reach, b);
  }
  if (reach < offset + n)
    throw CheckpointError("state '" + key + "': elements from " + std::to_string(reach) +
                          " of the requested [" + std::to_string(offset) + ", " +
                          std::to_string(offset + n) + ") were saved by no rank");
}

at::Tensor StateSource::whole(const std::string& key) const {
  const StateEntry& f = first(key);
  at::Tensor out = at::empty({f.logical_numel()}, f.data.options());
  read(key, 0, out);
  return out.view(f.shape);
}

dopt_state_reader StateSource::reader(const std::string* prefix) const {
  readers_.push_back(ReaderCtx{this, prefix});
  dopt_state_reader r{};
  r.struct_size = DOPT_STATE_READER_STRUCT_SIZE;
  r.ctx = &readers_.back();
  r.saved_world_size = saved_world_size();
  r.find = &find_cb;
  r.read = &read_cb;
  return r;
}

}  // namespace distopt::state
