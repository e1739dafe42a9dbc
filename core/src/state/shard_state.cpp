#include "state/shard_state.hpp"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/serialize.h>

#include <cstring>

#include "base/services.hpp"
#include "distopt/error.hpp"
#include "distopt/sdk/base/tensor.hpp"

namespace distopt::state {

namespace {

constexpr const char* kShardFormat = "distopt-shard-1";

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The entry put() and put_replicated() take: checked, and copied when `copy`.
StateEntry entry_of(const ShardState::WriterCtx* w, const dopt_state_entry* e, bool copy) {
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
  if (!src.is_contiguous()) throw CheckpointError("state '" + key + "': tensor is not contiguous");
  StateEntry s;
  s.key = key;
  s.kind = e->kind;
  s.offset = e->kind == DOPT_STATE_SHARDED ? e->offset : 0;
  s.shape.assign(e->shape, e->shape + e->ndim);
  // The caller's memory is borrowed for this call only.
  s.data = copy ? src.reshape({-1}).clone() : src.reshape({-1});
  return s;
}

dopt_status put_replicated(void* ctx, const dopt_state_entry* e) noexcept {
  auto* w = static_cast<ShardState::WriterCtx*>(ctx);
  try {
    StateEntry s = entry_of(w, e, false);
    if (s.kind != DOPT_STATE_SHARDED || s.offset != 0 || s.data.numel() != s.logical_numel())
      throw CheckpointError("state '" + s.key +
                            "': put_replicated takes a whole SHARDED tensor (offset 0)");
    w->shard->add_replicated(std::move(s));
    return DOPT_OK;
  } catch (const std::exception& ex) {
    set_last_error(ex.what());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
}

dopt_status put(void* ctx, const dopt_state_entry* e) noexcept {
  auto* w = static_cast<ShardState::WriterCtx*>(ctx);
  try {
    w->shard->add(entry_of(w, e, true));
    return DOPT_OK;
  } catch (const std::exception& ex) {
    set_last_error(ex.what());
    return DOPT_ERR_INVALID_ARGUMENT;
  }
}

// pack()'s reader: bounds-checked reads from `bytes`.
struct Cursor {
  const std::vector<char>& bytes;
  size_t at = 0;
  const std::string& where;
  void take(void* out, size_t n) {
    if (n > bytes.size() - at) throw CheckpointError(where + ": truncated");
    std::memcpy(out, bytes.data() + at, n);
    at += n;
  }
  int64_t i64() {
    int64_t v = 0;
    take(&v, sizeof v);
    return v;
  }
};

void put_i64(std::vector<char>& out, int64_t v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof v);
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

void ShardState::add_replicated(StateEntry e) {
  if (rank_ < 0)
    throw CheckpointError("state '" + e.key + "': replicated state put before keep_replicas()");
  if (keep_replicas_) {
    e.data = e.data.clone();
    e.replicated = true;
    add(std::move(e));
  } else if (rank_ == 0) {
    e.data = e.data.clone();
    add(std::move(e));
  }  // else: rank 0 keeps the one copy a checkpoint needs
}

void ShardState::add_replicas_of(const ShardState& other) {
  for (const StateEntry& e : other.entries_)
    if (e.replicated) {
      StateEntry c = e;
      c.replicated = false;
      add(std::move(c));
    }
}

uint64_t ShardState::data_bytes(bool replicas) const {
  uint64_t n = 0;
  for (const StateEntry& e : entries_)
    if (replicas || !e.replicated) n += e.data.nbytes();
  return n;
}

dopt_state_writer ShardState::writer(const std::string* prefix) {
  writers_.push_back(WriterCtx{this, prefix});
  dopt_state_writer w{};
  w.struct_size = DOPT_STATE_WRITER_STRUCT_SIZE;
  w.ctx = &writers_.back();
  w.put = &put;
  w.put_replicated = &put_replicated;
  return w;
}

// [i64 rank][i64 world][i64 count] then per entry: [i64 key length][key]
// [i64 kind][i64 replicated][i64 offset][i64 ndim][i64 shape...][i64 dtype]
// [i64 bytes][data].
std::vector<char> ShardState::pack(int rank, int world_size, Part part) const {
  auto takes = [part](const StateEntry& e) {
    return part == Part::all || (part == Part::replicas) == e.replicated;
  };
  std::vector<char> out;
  size_t reserve = 64;
  int64_t count = 0;
  for (const StateEntry& e : entries_)
    if (takes(e)) {
      ++count;
      reserve += e.data.nbytes() + e.key.size() + 8 * (8 + e.shape.size());
    }
  out.reserve(reserve);
  put_i64(out, rank);
  put_i64(out, world_size);
  put_i64(out, count);
  for (const StateEntry& e : entries_) {
    if (!takes(e)) continue;
    put_i64(out, static_cast<int64_t>(e.key.size()));
    out.insert(out.end(), e.key.begin(), e.key.end());
    put_i64(out, e.kind);
    put_i64(out, e.replicated ? 1 : 0);
    put_i64(out, e.offset);
    put_i64(out, static_cast<int64_t>(e.shape.size()));
    for (int64_t d : e.shape) put_i64(out, d);
    const at::Tensor data = e.data.contiguous();
    put_i64(out, static_cast<int64_t>(data.scalar_type()));
    put_i64(out, static_cast<int64_t>(data.nbytes()));
    const char* p = static_cast<const char*>(data.data_ptr());
    out.insert(out.end(), p, p + data.nbytes());
  }
  return out;
}

ShardState ShardState::unpack(const std::vector<char>& bytes, const std::string& where, int rank,
                              int world_size) {
  Cursor in{bytes, 0, where};
  const int64_t r = in.i64(), w = in.i64(), count = in.i64();
  if (r != rank || w != world_size)
    throw CheckpointError(where + ": holds rank " + std::to_string(r) + " of " + std::to_string(w) +
                          ", expected rank " + std::to_string(rank) + " of " +
                          std::to_string(world_size));
  ShardState s;
  for (int64_t i = 0; i < count; ++i) {
    StateEntry e;
    const int64_t key_len = in.i64();
    if (key_len < 0 || static_cast<size_t>(key_len) > bytes.size() - in.at)
      throw CheckpointError(where + ": truncated");
    e.key.assign(bytes.data() + in.at, static_cast<size_t>(key_len));
    in.at += static_cast<size_t>(key_len);
    e.kind = static_cast<int32_t>(in.i64());
    e.replicated = in.i64() != 0;
    e.offset = in.i64();
    const int64_t ndim = in.i64();
    if (ndim < 0 || ndim > 8) throw CheckpointError(where + ": bad shape of '" + e.key + "'");
    for (int64_t d = 0; d < ndim; ++d) e.shape.push_back(in.i64());
    const auto dtype = static_cast<at::ScalarType>(in.i64());
    const int64_t nbytes = in.i64();
    const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
    if (nbytes < 0 || nbytes % item != 0)
      throw CheckpointError(where + ": bad data of '" + e.key + "'");
    e.data = at::empty({nbytes / item}, at::TensorOptions().dtype(dtype));
    in.take(e.data.data_ptr(), static_cast<size_t>(nbytes));
    s.add(std::move(e));
  }
  return s;
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
