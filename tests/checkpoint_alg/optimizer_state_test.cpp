// sdk::save_optimizer_state / load_optimizer_state (distopt/sdk/optim/optimizer_state.hpp)
// in one process, against an in-memory state store that follows state.h's
// rules (sharded pieces with element offsets, lowest rank wins on overlap,
// reads of uncovered ranges fail naming the key). What the multi-process
// checkpoint tests cannot isolate: a state saved under one slicing reads
// back under any other, and another optimizer's state is refused by key.
#include "distopt/sdk/optim/optimizer_state.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::sdk::ParamSlice;

// Logical tensors as doubles, each element remembering the rank that put it.
struct Store {
  struct Entry {
    DLDataType dtype{};
    std::vector<int64_t> shape;
    std::vector<double> data;
    std::vector<int> owner;  // -1: not covered
  };
  std::map<std::string, Entry> entries;
  std::set<std::pair<int, std::string>> put_by;  // (rank, key): unique per rank
  int rank = 0;

  static dopt_status put(void* ctx, const dopt_state_entry* e) {
    auto* s = static_cast<Store*>(ctx);
    if (e->kind != DOPT_STATE_SHARDED || !s->put_by.insert({s->rank, e->key}).second)
      return DOPT_ERR_INVALID_ARGUMENT;
    int64_t global = 1;
    for (int32_t d = 0; d < e->ndim; ++d) global *= e->shape[d];
    at::Tensor piece = distopt::sdk::as_tensor(*e->tensor).to(at::kDouble).contiguous().view(-1);
    if (e->offset < 0 || e->offset + piece.numel() > global) return DOPT_ERR_INVALID_ARGUMENT;
    Entry& en = s->entries[e->key];
    if (en.data.empty()) {
      en.dtype = e->tensor->dtype;
      en.shape.assign(e->shape, e->shape + e->ndim);
      en.data.assign(static_cast<size_t>(global), 0);
      en.owner.assign(static_cast<size_t>(global), -1);
    }
    for (int64_t i = 0; i < piece.numel(); ++i) {
      auto k = static_cast<size_t>(e->offset + i);
      if (en.owner[k] >= 0 && en.owner[k] <= s->rank) continue;  // the lowest rank's
      en.data[k] = piece[i].item<double>();
      en.owner[k] = s->rank;
    }
    return DOPT_OK;
  }
  static dopt_status find(void* ctx, const char* key, int32_t* found, int32_t* kind,
                          DLDataType* dtype, int32_t* ndim, int64_t shape[8]) {
    auto* s = static_cast<Store*>(ctx);
    auto it = s->entries.find(key);
    *found = it != s->entries.end();
    if (*found) {
      if (kind) *kind = DOPT_STATE_SHARDED;
      if (dtype) *dtype = it->second.dtype;
      if (ndim) *ndim = static_cast<int32_t>(it->second.shape.size());
      if (shape)
        for (size_t d = 0; d < it->second.shape.size(); ++d) shape[d] = it->second.shape[d];
    }
    return DOPT_OK;
  }
  static dopt_status read(void* ctx, const char* key, int64_t offset, DLTensor* out) {
    auto* s = static_cast<Store*>(ctx);
    auto it = s->entries.find(key);
    if (it == s->entries.end()) {
      distopt::sdk::set_error(std::string("no state '") + key + "'");
      return DOPT_ERR_INVALID_ARGUMENT;
    }
    at::Tensor o = distopt::sdk::as_tensor(*out);
    const Entry& en = it->second;
    if (offset < 0 || offset + o.numel() > static_cast<int64_t>(en.data.size()))
      return DOPT_ERR_INVALID_ARGUMENT;
    at::Tensor src = at::empty({o.numel()}, at::kDouble);
    for (int64_t i = 0; i < o.numel(); ++i) {
      if (en.owner[static_cast<size_t>(offset + i)] < 0) return DOPT_ERR_INVALID_ARGUMENT;
      src[i] = en.data[static_cast<size_t>(offset + i)];
    }
    o.view(-1).copy_(src);
    return DOPT_OK;
  }

  dopt_state_writer writer() {
    return {DOPT_STATE_WRITER_V1_1_STRUCT_SIZE, nullptr, this, &Store::put, nullptr};  // a 1.5 host
  }
  dopt_state_reader reader(int32_t saved_world) {
    return {DOPT_STATE_READER_STRUCT_SIZE, nullptr, this, saved_world, &Store::find, &Store::read};
  }
};

// Two model parameters and a fixed sequence of gradients.
struct Model {
  std::vector<at::Tensor> params;  // "w" (4 x 5), "b" (5)
  std::vector<std::string> names = {"w", "b"};
  Model() {
    distopt::test::seed_cpu(3);
    params = {at::randn({4, 5}), at::randn({5})};
  }
};
at::Tensor grad_of(size_t param, int step, at::IntArrayRef shape) {
  distopt::test::seed_cpu(100 + 10 * step + static_cast<int>(param));
  return at::randn(shape);
}

std::unique_ptr<torch::optim::Optimizer> make(const std::string& name,
                                              const std::vector<at::Tensor>& ps) {
  if (name == "sgd")
    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (name == "adam")
    return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(0.01).amsgrad(true));
  if (name == "adamw")
    return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(0.01));
  if (name == "adagrad")
    return std::make_unique<torch::optim::Adagrad>(ps, torch::optim::AdagradOptions(0.1));
  return std::make_unique<torch::optim::RMSprop>(
      ps, torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
}

// The optimizer of one "rank" over pieces of the model's parameters:
// pieces[k] = (param, offset, numel); the stepped tensors own copies.
struct Sliced {
  std::vector<at::Tensor> tensors;
  std::vector<std::vector<ParamSlice>> slices{1};
  std::vector<std::tuple<size_t, int64_t, int64_t>> pieces;
  std::unique_ptr<torch::optim::Optimizer> opt;

  Sliced(const std::string& name, const Model& m,
         const std::vector<std::tuple<size_t, int64_t, int64_t>>& ps)
      : pieces(ps) {
    for (auto [p, off, n] : pieces) {
      tensors.push_back(m.params[p].reshape({-1}).narrow(0, off, n).clone());
      slices[0].push_back(
          {m.names[p], off,
           std::vector<int64_t>(m.params[p].sizes().begin(), m.params[p].sizes().end())});
    }
    opt = make(name, tensors);
  }
  void step(int s, const Model& m) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      auto [p, off, n] = pieces[k];
      tensors[k].mutable_grad() =
          grad_of(p, s, m.params[p].sizes()).reshape({-1}).narrow(0, off, n);
    }
    opt->step();
  }
};

// Rank layouts: whole parameters; a contiguous split across 3 ranks (w
// crosses a rank boundary); a greedy-like split across 2 ranks.
using Layout = std::vector<std::vector<std::tuple<size_t, int64_t, int64_t>>>;
const Layout kWhole = {{{0, 0, 20}, {1, 0, 5}}};
const Layout kThree = {{{0, 0, 9}}, {{0, 9, 9}}, {{0, 18, 2}, {1, 0, 5}}};
const Layout kTwo = {{{1, 0, 5}, {0, 0, 3}}, {{0, 3, 17}}};

std::vector<std::unique_ptr<Sliced>> build(const std::string& name, const Model& m,
                                           const Layout& l) {
  std::vector<std::unique_ptr<Sliced>> r;
  for (const auto& pieces : l) r.push_back(std::make_unique<Sliced>(name, m, pieces));
  return r;
}

// The model's parameters as the ranks' pieces hold them.
std::vector<at::Tensor> assemble(const Model& m,
                                 const std::vector<std::unique_ptr<Sliced>>& ranks) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.params) out.push_back(at::zeros({p.numel()}));
  for (const auto& r : ranks)
    for (size_t k = 0; k < r->tensors.size(); ++k) {
      auto [p, off, n] = r->pieces[k];
      out[p].narrow(0, off, n).copy_(r->tensors[k]);
    }
  return out;
}

// Train under layout `a` 3 steps, save, load into layout `b` (which
// starts from a's parameters), train both 3 more: b must equal a bitwise.
void roundtrip(const std::string& name, const Layout& a, const Layout& b) {
  Model m;
  auto ra = build(name, m, a);
  for (int s = 0; s < 3; ++s)
    for (auto& r : ra) r->step(s, m);
  Store store;
  for (size_t r = 0; r < ra.size(); ++r) {
    store.rank = static_cast<int>(r);
    auto w = store.writer();
    distopt::sdk::StateWriter sw(w);
    distopt::sdk::save_optimizer_state(*ra[r]->opt, ra[r]->slices, sw);
  }
  Model m2;
  auto now = assemble(m, ra);
  for (size_t p = 0; p < m2.params.size(); ++p) m2.params[p] = now[p].view(m2.params[p].sizes());
  auto rb = build(name, m2, b);
  auto rd = store.reader(static_cast<int32_t>(a.size()));
  distopt::sdk::StateReader sr(rd);
  for (auto& r : rb) distopt::sdk::load_optimizer_state(*r->opt, r->slices, sr);
  for (int s = 3; s < 6; ++s) {
    for (auto& r : ra) r->step(s, m);
    for (auto& r : rb) r->step(s, m2);
  }
  auto fa = assemble(m, ra), fb = assemble(m2, rb);
  for (size_t p = 0; p < fa.size(); ++p) {
    CAPTURE(p);
    CHECK(at::equal(fa[p], fb[p]));
  }
}

// The message sdk::Error carries when loading `saved`'s state into `loaded`.
std::string load_error(const std::string& saved, const std::string& loaded) {
  Model m;
  auto ra = build(saved, m, kWhole);
  ra[0]->step(0, m);
  Store store;
  auto w = store.writer();
  distopt::sdk::StateWriter sw(w);
  distopt::sdk::save_optimizer_state(*ra[0]->opt, ra[0]->slices, sw);
  auto rb = build(loaded, m, kTwo);
  auto rd = store.reader(1);
  distopt::sdk::StateReader sr(rd);
  try {
    distopt::sdk::load_optimizer_state(*rb[0]->opt, rb[0]->slices, sr);
  } catch (const distopt::sdk::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("optimizer state saved under one slicing loads under another, bitwise") {
  for (const char* name : {"sgd", "adam", "adamw", "adagrad", "rmsprop"}) {
    CAPTURE(name);
    roundtrip(name, kWhole, kThree);  // allreduce -> zero, 3 ranks
    roundtrip(name, kThree, kTwo);    // reshard 3 -> 2
    roundtrip(name, kTwo, kWhole);    // zero -> allreduce
  }
  roundtrip("adam", kWhole, kWhole);
}

TEST_CASE("another optimizer's state is refused, naming the key") {
  std::string e = load_error("sgd", "adam");
  CAPTURE(e);
  CHECK(e.find("optimizer/b/step") != std::string::npos);
  CHECK(e.find("optimizer/b/momentum_buffer") != std::string::npos);
  e = load_error("rmsprop", "sgd");  // rmsprop has a momentum_buffer too
  CHECK(e.find("optimizer/b/step") != std::string::npos);
  e = load_error("adam", "adagrad");  // adagrad needs its sum
  CHECK(e.find("optimizer/b/sum") != std::string::npos);
  e = load_error("adamw", "rmsprop");
  CHECK(e.find("optimizer/b/square_avg") != std::string::npos);
  CHECK(load_error("adam", "adamw").empty());  // same fields: interchangeable
  // this test's adam has amsgrad, which needs max_exp_avg_sq
  CHECK(load_error("adamw", "adam").find("optimizer/b/max_exp_avg_sq") != std::string::npos);
}

TEST_CASE("a never-stepped optimizer saves nothing and loads as fresh") {
  Model m;
  auto ra = build("adam", m, kWhole);
  Store store;
  auto w = store.writer();
  distopt::sdk::StateWriter sw(w);
  distopt::sdk::save_optimizer_state(*ra[0]->opt, ra[0]->slices, sw);
  CHECK(store.entries.empty());
  auto rb = build("adam", m, kThree);
  auto rd = store.reader(1);
  distopt::sdk::StateReader sr(rd);
  for (auto& r : rb) {
    distopt::sdk::load_optimizer_state(*r->opt, r->slices, sr);
    CHECK(r->opt->state().empty());
  }
}
