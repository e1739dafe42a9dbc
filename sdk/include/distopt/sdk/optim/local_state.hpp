// Per-rank copies of state that the SDK's helpers put as replicated: for
// algorithms whose ranks hold different values (decentralized SGD, local
// SGD), so save_optimizer_state / load_optimizer_state serve them too.
// Torch-free.
#pragma once

#include <string>
#include <utility>

#include "distopt/sdk/base/state_io.hpp"

namespace distopt::sdk {

/// Puts every entry written through writer() as this rank's own value
/// (DOPT_STATE_RANK_LOCAL) under `prefix` + key, through `base`. Entries must
/// be whole tensors (offset 0, the piece is the logical tensor); a slice
/// throws sdk::Error(INVALID_ARGUMENT) naming the key. Not thread-safe.
class RankLocalWriter {
 public:
  RankLocalWriter(StateWriter& base, std::string prefix)
      : base_(base),
        prefix_(std::move(prefix)),
        c_{DOPT_STATE_WRITER_STRUCT_SIZE, nullptr, this, &RankLocalWriter::put,
           &RankLocalWriter::put},  // replicated or not: this rank's own copy
        writer_(c_) {}
  RankLocalWriter(const RankLocalWriter&) = delete;
  RankLocalWriter& operator=(const RankLocalWriter&) = delete;
  StateWriter& writer() { return writer_; }

 private:
  static dopt_status put(void* ctx, const dopt_state_entry* e) noexcept {
    auto* self = static_cast<RankLocalWriter*>(ctx);
    try {
      int64_t whole = 1;
      for (int32_t i = 0; i < e->ndim; ++i) whole *= e->shape[i];
      int64_t piece = 1;
      for (int32_t i = 0; i < e->tensor->ndim; ++i) piece *= e->tensor->shape[i];
      if (e->offset != 0 || piece != whole)
        throw Error(DOPT_ERR_INVALID_ARGUMENT, std::string("state '") + e->key +
                                                   "': a rank-local copy must be a whole tensor");
      self->base_.put_local(self->prefix_ + e->key, *e->tensor);
      return DOPT_OK;
    } catch (const Error& err) {
      if (!err.already_reported()) set_error(err.what());
      return err.status();
    } catch (const std::exception& err) {
      set_error(err.what());
      return DOPT_ERR_INTERNAL;
    }
  }

  StateWriter& base_;
  std::string prefix_;
  dopt_state_writer c_;
  StateWriter writer_;
};

/// Reads `prefix` + key where the checkpoint has it, else key itself: loads
/// what RankLocalWriter put, and falls back to the replicated entries of a
/// checkpoint written by another algorithm. Not thread-safe.
class PreferPrefixReader {
 public:
  PreferPrefixReader(const StateReader& base, std::string prefix)
      : base_(base.c()),
        prefix_(std::move(prefix)),
        c_{DOPT_STATE_READER_STRUCT_SIZE,
           nullptr,
           this,
           base.saved_world_size(),
           &PreferPrefixReader::find,
           &PreferPrefixReader::read},
        reader_(c_) {}
  PreferPrefixReader(const PreferPrefixReader&) = delete;
  PreferPrefixReader& operator=(const PreferPrefixReader&) = delete;
  const StateReader& reader() const { return reader_; }

 private:
  std::string resolve(const char* key) const {
    const std::string local = prefix_ + key;
    int32_t found = 0;
    if (base_.find(base_.ctx, local.c_str(), &found, nullptr, nullptr, nullptr, nullptr) ==
            DOPT_OK &&
        found)
      return local;
    return key;
  }
  static dopt_status find(void* ctx, const char* key, int32_t* found, int32_t* kind,
                          DLDataType* dtype, int32_t* ndim, int64_t shape[8]) noexcept {
    auto* self = static_cast<PreferPrefixReader*>(ctx);
    try {
      return self->base_.find(self->base_.ctx, self->resolve(key).c_str(), found, kind, dtype, ndim,
                              shape);
    } catch (const std::exception& e) {
      set_error(e.what());
      return DOPT_ERR_INTERNAL;
    }
  }
  static dopt_status read(void* ctx, const char* key, int64_t offset, DLTensor* out) noexcept {
    auto* self = static_cast<PreferPrefixReader*>(ctx);
    try {
      return self->base_.read(self->base_.ctx, self->resolve(key).c_str(), offset, out);
    } catch (const std::exception& e) {
      set_error(e.what());
      return DOPT_ERR_INTERNAL;
    }
  }

  const dopt_state_reader& base_;
  std::string prefix_;
  dopt_state_reader c_;
  StateReader reader_;
};

}  // namespace distopt::sdk
