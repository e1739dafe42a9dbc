// The reducers' checkpoint state (ABI 1.1 save_state / load_state) at the
// plugin boundary, on 2 real processes over loopback (tcp communicator),
// with an in-memory state writer / reader standing in for the host's shards
// (same world size: rank r reads what rank r saved).
//
// Per reducer, each rank reduces two hand-made buckets with deterministic
// gradients:
//   A: one reducer runs kSave steps, saves into the store, runs kMore more
//      (the uninterrupted run; saving must not disturb it);
//   B: a fresh reducer loads the store, saves again at once (must equal the
//      first save entry by entry, bit for bit: the state was really
//      restored), then runs the kMore steps: must equal A's bit for bit;
//   C: a fresh reducer WITHOUT load runs the kMore steps: differs from A for
//      every stateful reducer (the control that shows B's test can fail).
// Forked children do the torch work and write a summary that the parent
// checks (the parent never touches torch, so it can keep forking).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/host_api.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/reducer.h"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::test::fork_ranks;
using distopt::test::random_port;

constexpr int kWorld = 2, kSave = 4, kMore = 4;

// ---- an in-memory dopt_state_writer / dopt_state_reader -------------------

struct Entry {
  int32_t kind = 0;
  std::vector<int64_t> shape;  // logical shape
  at::Tensor whole;            // the logical tensor (SHARDED: assembled from pieces)
};
using Store = std::map<std::string, Entry>;

dopt_status put(void* ctx, const dopt_state_entry* e) {
  auto& store = *static_cast<Store*>(ctx);
  if (!e || !e->key || !e->tensor || store.count(e->key)) return DOPT_ERR_INVALID_ARGUMENT;
  at::Tensor piece = distopt::sdk::as_tensor(*e->tensor).clone().view({-1});
  Entry en;
  en.kind = e->kind;
  en.shape.assign(e->shape, e->shape + e->ndim);
  if (e->kind == DOPT_STATE_SHARDED) {
    int64_t n = 1;
    for (int64_t d : en.shape) n *= d;
    if (e->offset < 0 || e->offset + piece.numel() > n) return DOPT_ERR_INVALID_ARGUMENT;
    // This test's reducers put whole tensors; a real host merges pieces.
    en.whole = at::zeros({n}, piece.options());
    en.whole.narrow(0, e->offset, piece.numel()).copy_(piece);
  } else {
    en.whole = piece;
  }
  store[e->key] = en;
  return DOPT_OK;
}

dopt_status find(void* ctx, const char* key, int32_t* found, int32_t* kind, DLDataType* dtype,
                 int32_t* ndim, int64_t shape[8]) {
  auto& store = *static_cast<Store*>(ctx);
  auto it = store.find(key);
  *found = it != store.end();
  if (!*found) return DOPT_OK;
  if (kind) *kind = it->second.kind;
  if (dtype) *dtype = distopt::sdk::to_dl_dtype(it->second.whole.scalar_type());
  if (ndim) *ndim = static_cast<int32_t>(it->second.shape.size());
  if (shape)
    for (size_t d = 0; d < it->second.shape.size(); ++d) shape[d] = it->second.shape[d];
  return DOPT_OK;
}

dopt_status read(void* ctx, const char* key, int64_t offset, DLTensor* out) {
  auto& store = *static_cast<Store*>(ctx);
  auto it = store.find(key);
  if (it == store.end()) return DOPT_ERR_INVALID_ARGUMENT;
  at::Tensor dst = distopt::sdk::as_tensor(*out).view({-1});
  if (offset < 0 || offset + dst.numel() > it->second.whole.numel())
    return DOPT_ERR_INVALID_ARGUMENT;
  dst.copy_(it->second.whole.narrow(0, offset, dst.numel()));
  return DOPT_OK;
}

// What the host does between save and load: every rank's store goes to a
// file; each rank then reads SHARDED entries from whichever rank put them
// and RANK_LOCAL ones from its own file (same world size).
void write_store(const Store& st, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  auto put_i64 = [&](int64_t v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); };
  put_i64(static_cast<int64_t>(st.size()));
  for (const auto& [k, e] : st) {
    put_i64(static_cast<int64_t>(k.size()));
    f.write(k.data(), static_cast<std::streamsize>(k.size()));
    put_i64(e.kind);
    put_i64(static_cast<int64_t>(e.whole.scalar_type()));
    put_i64(static_cast<int64_t>(e.shape.size()));
    for (int64_t d : e.shape) put_i64(d);
    put_i64(e.whole.numel());
    f.write(static_cast<const char*>(e.whole.data_ptr()),
            static_cast<std::streamsize>(e.whole.nbytes()));
  }
}
Store read_store(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  auto get_i64 = [&] {
    int64_t v = 0;
    f.read(reinterpret_cast<char*>(&v), sizeof v);
    return v;
  };
  Store st;
  const int64_t n = get_i64();
  for (int64_t i = 0; i < n; ++i) {
    std::string k(static_cast<size_t>(get_i64()), '\0');
    f.read(k.data(), static_cast<std::streamsize>(k.size()));
    Entry e;
    e.kind = static_cast<int32_t>(get_i64());
    const auto dt = static_cast<at::ScalarType>(get_i64());
    e.shape.resize(static_cast<size_t>(get_i64()));
    for (int64_t& d : e.shape) d = get_i64();
    e.whole = at::empty({get_i64()}, at::TensorOptions().dtype(dt));
    f.read(static_cast<char*>(e.whole.data_ptr()), static_cast<std::streamsize>(e.whole.nbytes()));
    st[k] = e;
  }
  return st;
}
Store exchange(const Store& mine, int rank, const std::string& path_prefix, distopt::Runtime& rt) {
  write_store(mine, path_prefix + std::to_string(rank));
  rt.barrier();
  Store merged;
  for (int r = kWorld - 1; r >= 0; --r)  // the lowest rank's SHARDED entry wins
    for (auto& [k, e] : read_store(path_prefix + std::to_string(r)))
      if (e.kind == DOPT_STATE_SHARDED || r == rank) merged[k] = e;
  rt.barrier();
  std::remove((path_prefix + std::to_string(rank)).c_str());
  return merged;
}

// Entry-by-entry, bit-for-bit equality (kind, shape, dtype, bytes).
bool same_store(const Store& a, const Store& b, std::string& why) {
  if (a.size() != b.size()) {
    why = std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " entries";
    return false;
  }
  for (const auto& [k, ea] : a) {
    auto it = b.find(k);
    if (it == b.end()) {
      why = "missing " + k;
      return false;
    }
    const Entry& eb = it->second;
    if (ea.kind != eb.kind || ea.shape != eb.shape ||
        ea.whole.scalar_type() != eb.whole.scalar_type() || ea.whole.numel() != eb.whole.numel() ||
        std::memcmp(ea.whole.data_ptr(), eb.whole.data_ptr(), ea.whole.nbytes()) != 0) {
      why = "differs: " + k;
      return false;
    }
  }
  return true;
}

// ---- buckets and gradients -------------------------------------------------

struct Param {
  std::string name;
  std::vector<int64_t> shape;
};
// Bucket 0 then bucket 1 (the order backward completes them).
const std::vector<std::vector<Param>> kBuckets = {
    {{"fc2.weight", {8, 24}}, {"fc2.bias", {8}}},
    {{"fc1.weight", {24, 20}}, {"fc1.bias", {24}}, {"conv.weight", {6, 2, 3, 3}}}};

float uniform(uint64_t key) {  // splitmix64 -> [-1, 1)
  uint64_t z = key + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

struct HostBucket {
  std::vector<std::string> names;
  std::vector<dopt_bucket_entry> entries;
  std::vector<float> flat;
  int64_t flat_shape = 0;
  DLTensor dl{};
  dopt_bucket b{};
};

// Entries 4-element aligned, one padding element at least between them.
std::vector<HostBucket> make_buckets() {
  std::vector<HostBucket> out(kBuckets.size());
  for (size_t bi = 0; bi < kBuckets.size(); ++bi) {
    HostBucket& h = out[bi];
    size_t off = 0;
    for (const Param& p : kBuckets[bi]) h.names.push_back(p.name);
    for (size_t k = 0; k < kBuckets[bi].size(); ++k) {
      const Param& p = kBuckets[bi][k];
      size_t n = 1;
      for (int64_t d : p.shape) n *= static_cast<size_t>(d);
      dopt_bucket_entry e{};
      e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
      e.name = h.names[k].c_str();
      e.param_index = static_cast<int32_t>(k);
      e.offset = off;
      e.numel = n;
      e.ndim = static_cast<int32_t>(p.shape.size());
      e.shape = p.shape.data();
      h.entries.push_back(e);
      off = (off + n + 1 + 3) / 4 * 4;
    }
    h.flat.assign(off, 0.0f);
    h.dl = distopt::make_dltensor(h.flat.data(), static_cast<int64_t>(off),
                                  DLDataType{kDLFloat, 32, 1}, &h.flat_shape);
    h.b.struct_size = DOPT_BUCKET_STRUCT_SIZE;
    h.b.index = static_cast<int32_t>(bi);
    h.b.flat = &h.dl;
    h.b.entries = h.entries.data();
    h.b.num_entries = h.entries.size();
  }
  return out;
}

void fill(std::vector<HostBucket>& bs, int rank, int step) {
  for (size_t bi = 0; bi < bs.size(); ++bi)
    for (size_t i = 0; i < bs[bi].flat.size(); ++i)
      // A part common to all steps and ranks (so PowerSGD's warm start and
      // the residuals matter), plus per-rank, per-step noise.
      bs[bi].flat[i] = uniform((bi << 40) ^ i) +
                       0.5f * uniform((static_cast<uint64_t>(rank) << 56) ^
                                      (static_cast<uint64_t>(step) << 48) ^ (bi << 40) ^ i);
}

struct Case {
  const char* reducer;
  const char* options;
  bool stateful;
};
const Case kCases[] = {
    {"powersgd", "{rank: 2, start_iter: 2, min_compression_rate: 0, warm_start: true}", true},
    // warm_start off: a fresh Q every step, so the generator state carries it.
    {"powersgd", "{rank: 2, start_iter: 1, warm_start: false}", true},
    {"signsgd", "{error_feedback: true}", true},
    {"topk", "{ratio: 0.1}", true},
    {"randomk", "{ratio: 0.1, seed: 7}", true},
    // Without error feedback randomk still has its draw counter.
    {"randomk", "{ratio: 0.1, error_feedback: false}", true},
    {"signsgd", "{error_feedback: false}", false},
    {"fp16", "{}", false},
    {"bf16", "{}", false},
    {"mean", "{}", false},
};

struct Summary {
  std::string keys;           // saved keys, sorted, ';'-separated
  bool resave_equal = false;  // B's save right after load == A's save
  std::string resave_why;
  size_t b_mismatches = 0;  // B vs A, elements differing in any bit (all kMore steps)
  double c_max_diff = 0;    // C vs A
};

Summary run_case(const Case& c, int rank, distopt::Runtime& rt, const std::string& dir) {
  using namespace distopt;
  const ComponentInfo& info = rt.registry().get(DOPT_KIND_REDUCER, c.reducer);
  Options opts =
      Options::validate(YAML::Load(c.options), info.options, "<test>", "reducer.options");
  dopt_create_args args{};
  args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  args.rank = rank;
  args.world_size = kWorld;
  args.local_rank = rank;
  args.local_world_size = kWorld;
  args.options = opts.c_handle();
  args.scope = "test/reducer";
  const auto* vt = static_cast<const dopt_reducer_v1*>(info.vtable);
  REQUIRE(vt->struct_size >= DOPT_REDUCER_V1_1_STRUCT_SIZE);

  auto buckets = make_buckets();
  std::vector<dopt_bucket> bv;
  for (auto& h : buckets) bv.push_back(h.b);
  auto create = [&] {
    dopt_reducer* red = nullptr;
    check_status(vt->create(&args, rt.communicator().ref(), bv.data(), bv.size(), &red), c.reducer,
                 "create");
    return red;
  };
  // Reduce every bucket for steps [from, to); returns the concatenated outputs.
  auto steps = [&](dopt_reducer* red, int from, int to) {
    std::vector<float> out;
    for (int step = from; step < to; ++step) {
      fill(buckets, rank, step);
      for (auto& h : buckets) {
        dopt_reduce_request* req = nullptr;
        check_status(vt->reduce(red, &h.b, &req), c.reducer, "reduce");
        check_status(vt->wait(req, 60000), c.reducer, "wait");
        vt->request_free(req);
        out.insert(out.end(), h.flat.begin(), h.flat.end());
      }
    }
    return out;
  };
  auto save = [&](dopt_reducer* red, Store& st) {
    dopt_state_writer w{DOPT_STATE_WRITER_V1_1_STRUCT_SIZE, nullptr, &st, &put,
                        nullptr};  // a 1.5 host
    check_status(vt->save_state(red, &w), c.reducer, "save_state");
  };
  auto load = [&](dopt_reducer* red, const Store& st) {
    dopt_state_reader r{
        DOPT_STATE_READER_STRUCT_SIZE, nullptr, const_cast<Store*>(&st), kWorld, &find, &read};
    check_status(vt->load_state(red, &r), c.reducer, "load_state");
  };

  Summary s;
  Store saved, resaved;
  dopt_reducer* a = create();
  steps(a, 0, kSave);
  save(a, saved);
  const auto ref = steps(a, kSave, kSave + kMore);
  check_status(vt->destroy(a), c.reducer, "destroy");

  Store checkpoint = exchange(saved, rank, dir + "/store", rt);
  dopt_reducer* b = create();
  load(b, checkpoint);
  save(b, resaved);
  s.resave_equal = same_store(saved, resaved, s.resave_why);
  const auto got = steps(b, kSave, kSave + kMore);
  check_status(vt->destroy(b), c.reducer, "destroy");
  for (size_t i = 0; i < ref.size(); ++i)
    s.b_mismatches += std::memcmp(&ref[i], &got[i], sizeof(float)) != 0;

  dopt_reducer* f = create();
  const auto fresh = steps(f, kSave, kSave + kMore);
  check_status(vt->destroy(f), c.reducer, "destroy");
  for (size_t i = 0; i < ref.size(); ++i)
    s.c_max_diff = std::max(s.c_max_diff, static_cast<double>(std::fabs(ref[i] - fresh[i])));
  for (const auto& kv : saved) s.keys += kv.first + ";";
  return s;
}

std::string tmpdir() { return distopt::test::make_temp_dir("distopt_red_state"); }

}  // namespace

TEST_CASE("every reducer's save_state / load_state resumes bit-exactly (plugin boundary)") {
  const std::string dir = tmpdir();
  const int port = random_port();
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        setenv("OMP_NUM_THREADS", "1", 1);
        at::set_num_threads(1);
        std::ostringstream y;
        y << distopt::test::plugins_and_world_yaml(kWorld, port)
          << "communicator: {name: tcp}\nreducer: {name: mean}\n";
        auto rt = distopt::test::rank_runtime(y.str(), rank, kWorld, "reducer_state.yaml");
        std::ofstream out(dir + "/rank" + std::to_string(rank) + ".txt");
        for (const Case& c : kCases) {
          Summary s = run_case(c, rank, rt, dir);
          out << s.keys << "\n"
              << s.resave_equal << " " << s.b_mismatches << " " << s.c_max_diff << "\n"
              << s.resave_why << "\n";
        }
        out.close();
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".txt");
    for (const Case& c : kCases) {
      const std::string name = c.reducer, opts = c.options;
      CAPTURE(name);
      CAPTURE(opts);
      std::string keys, line, why;
      REQUIRE(std::getline(in, keys));
      REQUIRE(std::getline(in, line));
      std::getline(in, why);
      std::istringstream ls(line);
      int resave_equal = 0;
      size_t mismatches = 0;
      double c_diff = 0;
      ls >> resave_equal >> mismatches >> c_diff;
      CAPTURE(keys);
      CAPTURE(why);
      if (r == 0) MESSAGE(name << " " << opts << ": fresh reducer differs by " << c_diff);
      CHECK(resave_equal == 1);
      CHECK(mismatches == 0);
      if (c.stateful) {
        CHECK(c_diff > 1e-3);  // without the state the run is another one
      } else {
        CHECK(keys.empty());
        CHECK(c_diff == 0);
      }
      const bool ef =
          (name == "topk" || name == "randomk" || name == "powersgd" || name == "signsgd") &&
          opts.find("error_feedback: false") == std::string::npos;
      if (ef) {
        CHECK(keys.find("error_feedback/fc1.weight;") != std::string::npos);
        CHECK(keys.find("error_feedback/fc2.weight;") != std::string::npos);
      }
      if (name == "powersgd") {
        // Rank 0 alone puts what is identical on every rank: the generator,
        // the step counts and the Q's (an allreduce's result).
        CHECK((keys.find("powersgd/rng;") != std::string::npos) == (r == 0));
        CHECK((keys.find("powersgd/step/fc1.bias;") != std::string::npos) == (r == 0));
        CHECK((keys.find("powersgd/q/fc1.weight;") != std::string::npos) == (r == 0));
        CHECK((keys.find("powersgd/q/conv.weight;") != std::string::npos) == (r == 0));
      }
      if (name == "randomk")
        CHECK((keys.find("randomk/step/fc1.weight;") != std::string::npos) == (r == 0));
    }
    std::remove((dir + "/rank" + std::to_string(r) + ".txt").c_str());
  }
  std::remove(dir.c_str());
}
