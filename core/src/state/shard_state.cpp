#include "state/shard_state.hpp"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/serialize.h>

#include "distopt/error.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "host/services.hpp"

namespace distopt::state {

namespace {

constexpr const char* kShardFormat = "distopt-shard-1";

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

dopt_status put(void* ctx, const dopt_state_entry* e) noexcept {
  auto* w = static_cast<ShardState::WriterCtx*>(ctx);
  try {
    if (!e || e->struct_size < DOPT_STATE_ENTRY_STRUCT_SIZE || !e->key || !*e->key || !e->tensor)
      throw CheckpointError("state entry without key or tensor");
    const std::string key = *w->prefix + e->key;
    if (e->kind != DOPT_STATE_SHARDED && e->kind != DOPT_STATE_RANK_LOCAL)
      throw CheckpointError("state '" + key + "': unknown kind " + std::to_string(e->kind));
    if (e->ndim < 0 || e->ndim > 8 || (e->ndim > 0 && !e->shape))
      throw CheckpointError("state '" + key + "': bad shape (ndim " + std::to_string(e->ndim) +
                            ", at most 8)");
    const DLTensor& t = *e->tensor;
    if (t.device.device_type != kDLCPU)
      throw CheckpointError("state '" + key + "': tensor is not on the CPU");
    at::Tensor src = sdk::as_tensor(t);
    if (!src.is_contiguous())
      throw CheckpointError("state '" + key + "': tensor is not contiguous");
    StateEntry s;
    s.key = key;
    s.kind = e->kind;
    s.offset = e->kind == DOPT_STATE_SHARDED ? e->offset : 0;
    s.shape.assign(e->shape, e->shape + e->ndim);
    s.data = src.reshape({-1}).clone();  // the caller's memory is borrowed for this call only
    w->shard->add(std::move(s));
    return DOPT_OK;
  } catch (const std::exception& ex) {
    set_last_error(ex.what());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
}

}  // namespace

int64_t StateEntry::logical_numel() const { return product(shape); }

void ShardState::add(StateEntry e) {
  if (e.offset < 0 || e.offset + e.data.numel() > e.logical_numel())
    throw CheckpointError("state '" + e.key + "': elements [" + std::to_string(e.offset) + ", " +
                          std::to_string(e.offset + e.data.numel()) +
                          ") are outside its logical tensor of " +
                          std::to_string(e.logical_numel()) + " elements");
  if (!index_.emplace(e.key, entries_.size()).second)
    throw CheckpointError("state '" + e.key + "' was put twice");
  entries_.push_back(std::move(e));
}

dopt_state_writer ShardState::writer(const std::string* prefix) {
  writers_.push_back(WriterCtx{this, prefix});
  dopt_state_writer w{};
  w.struct_size = DOPT_STATE_WRITER_STRUCT_SIZE;
  w.ctx = &writers_.back();
  w.put = &put;
  return w;
}

std::vector<char> ShardState::encode(int rank, int world_size) const {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& e : entries_) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("key", e.key);
    d.insert("kind", static_cast<int64_t>(e.kind));
    d.insert("offset", e.offset);
    d.insert("shape", c10::List<int64_t>(e.shape));
    d.insert("data", e.data);
    list.push_back(d);
  }
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("format", std::string(kShardFormat));
  root.insert("rank", static_cast<int64_t>(rank));
  root.insert("world_size", static_cast<int64_t>(world_size));
  root.insert("entries", list);
  return torch::pickle_save(root);
}

ShardState ShardState::decode(const std::vector<char>& bytes, const std::string& file, int rank,
                              int world_size) {
  ShardState s;
  try {
    c10::IValue v = torch::pickle_load(bytes);
    auto root = v.toGenericDict();
    if (!root.contains("format") || root.at("format").toStringRef() != kShardFormat)
      throw CheckpointError("not a distopt shard (format is not " + std::string(kShardFormat) +
                            ")");
    if (root.at("rank").toInt() != rank || root.at("world_size").toInt() != world_size)
      throw CheckpointError("holds rank " + std::to_string(root.at("rank").toInt()) + " of " +
                            std::to_string(root.at("world_size").toInt()) + ", expected rank " +
                            std::to_string(rank) + " of " + std::to_string(world_size));
    const c10::IValue entries = root.at("entries");  // holds the list the loop reads
    for (const c10::IValue& item : entries.toListRef()) {
      auto d = item.toGenericDict();
      StateEntry e;
      e.key = d.at("key").toStringRef();
      e.kind = static_cast<int32_t>(d.at("kind").toInt());
      e.offset = d.at("offset").toInt();
      e.shape = d.at("shape").toIntVector();
      e.data = d.at("data").toTensor().reshape({-1});
      s.add(std::move(e));
    }
  } catch (const CheckpointError& e) {
    throw CheckpointError(file + ": " + e.what());
  } catch (const std::exception& e) {
    // c10::Error's what() carries a C++ backtrace: keep its first line.
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw CheckpointError(file + ": cannot be decoded (corrupt or not a distopt shard): " + msg);
  }
  return s;
}

}  // namespace distopt::state
