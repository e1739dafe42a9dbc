// Harness for the reducers' two implementations: the CPU kernels
// (`kernels: cpu`) and the device-generic libtorch path (`kernels:
// generic`), both on host buckets, on real processes over loopback (tcp),
// driven through the reducer ABI as the host drives them. Torch-free (the
// parent keeps forking).
//
// Per case, every rank runs with deterministic per-rank gradients:
//   A: kernels cpu, steps [0, save), save_state, steps [save, end);
//   B: kernels generic, the same;
//   C: kernels generic, load A's checkpoint, steps [save, end)  (vs A);
//   D: kernels cpu, load B's checkpoint, steps [save, end)      (vs B);
//   F: kernels generic, fresh (no load), steps [save, end)      (vs A:
//      the control showing that C's check can fail for a stateful reducer).
// Checkpoints go through an in-memory byte store: SHARDED entries are
// exchanged between ranks through files (the lowest rank's wins), RANK_LOCAL
// ones stay with their rank. Each rank writes a Summary the parent checks.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm_helpers.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/reducer.h"

namespace distopt::test::kernels {

// ---- an in-memory, torch-free dopt_state_writer / reader -------------------

struct Entry {
  int32_t kind = 0;
  DLDataType dtype{};
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // the whole logical tensor
};
using Store = std::map<std::string, Entry>;

inline size_t elem_bytes(DLDataType t) { return (t.bits * t.lanes + 7) / 8; }
inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

inline dopt_status store_put(void* ctx, const dopt_state_entry* e) {
  auto& st = *static_cast<Store*>(ctx);
  if (!e || !e->key || !e->tensor || st.count(e->key) || e->tensor->device.device_type != kDLCPU)
    return DOPT_ERR_INVALID_ARGUMENT;
  const DLTensor& t = *e->tensor;
  int64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
  Entry en;
  en.kind = e->kind;
  en.dtype = t.dtype;
  en.shape.assign(e->shape, e->shape + e->ndim);
  const size_t eb = elem_bytes(t.dtype);
  const int64_t whole = e->kind == DOPT_STATE_SHARDED ? numel_of(en.shape) : n;
  if (e->offset < 0 || e->offset + n > whole) return DOPT_ERR_INVALID_ARGUMENT;
  en.bytes.assign(static_cast<size_t>(whole) * eb, 0);
  std::memcpy(en.bytes.data() + static_cast<size_t>(e->offset) * eb,
              static_cast<const char*>(t.data) + t.byte_offset, static_cast<size_t>(n) * eb);
  st[e->key] = std::move(en);
  return DOPT_OK;
}

inline dopt_status store_find(void* ctx, const char* key, int32_t* found, int32_t* kind,
                              DLDataType* dtype, int32_t* ndim, int64_t shape[8]) {
  auto& st = *static_cast<Store*>(ctx);
  auto it = st.find(key);
  *found = it != st.end();
  if (!*found) return DOPT_OK;
  if (kind) *kind = it->second.kind;
  if (dtype) *dtype = it->second.dtype;
  if (ndim) *ndim = static_cast<int32_t>(it->second.shape.size());
  if (shape)
    for (size_t d = 0; d < it->second.shape.size(); ++d) shape[d] = it->second.shape[d];
  return DOPT_OK;
}

// Same dtype only (what these reducers read back): a conversion is the host's job.
inline dopt_status store_read(void* ctx, const char* key, int64_t offset, DLTensor* out) {
  auto& st = *static_cast<Store*>(ctx);
  auto it = st.find(key);
  if (it == st.end()) return DOPT_ERR_INVALID_ARGUMENT;
  const Entry& e = it->second;
  if (out->dtype.code != e.dtype.code || out->dtype.bits != e.dtype.bits)
    return DOPT_ERR_UNSUPPORTED;
  int64_t n = 1;
  for (int32_t d = 0; d < out->ndim; ++d) n *= out->shape[d];
  const size_t eb = elem_bytes(e.dtype);
  if (offset < 0 || static_cast<size_t>(offset + n) * eb > e.bytes.size())
    return DOPT_ERR_INVALID_ARGUMENT;
  std::memcpy(static_cast<char*>(out->data) + out->byte_offset,
              e.bytes.data() + static_cast<size_t>(offset) * eb, static_cast<size_t>(n) * eb);
  return DOPT_OK;
}

inline void write_store(const Store& st, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  auto put = [&](int64_t v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<int64_t>(st.size()));
  for (const auto& [k, e] : st) {
    put(static_cast<int64_t>(k.size()));
    f.write(k.data(), static_cast<std::streamsize>(k.size()));
    put(e.kind);
    put(e.dtype.code);
    put(e.dtype.bits);
    put(static_cast<int64_t>(e.shape.size()));
    for (int64_t d : e.shape) put(d);
    put(static_cast<int64_t>(e.bytes.size()));
    f.write(reinterpret_cast<const char*>(e.bytes.data()),
            static_cast<std::streamsize>(e.bytes.size()));
  }
}

inline Store read_store(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  auto get = [&] {
    int64_t v = 0;
    f.read(reinterpret_cast<char*>(&v), sizeof v);
    return v;
  };
  Store st;
  const int64_t n = get();
  for (int64_t i = 0; i < n; ++i) {
    std::string k(static_cast<size_t>(get()), '\0');
    f.read(&k[0], static_cast<std::streamsize>(k.size()));
    Entry e;
    e.kind = static_cast<int32_t>(get());
    e.dtype.code = static_cast<uint8_t>(get());
    e.dtype.bits = static_cast<uint8_t>(get());
    e.dtype.lanes = 1;
    e.shape.resize(static_cast<size_t>(get()));
    for (int64_t& d : e.shape) d = get();
    e.bytes.resize(static_cast<size_t>(get()));
    f.read(reinterpret_cast<char*>(e.bytes.data()), static_cast<std::streamsize>(e.bytes.size()));
    st[k] = std::move(e);
  }
  return st;
}

// ---- buckets ----------------------------------------------------------------

struct Param {
  std::string name;
  std::vector<int64_t> shape;
};
using BucketSpec = std::vector<Param>;

// One rank's host buckets: entries 4-element aligned with at least one
// padding element between them; float32 or float64 storage.
struct Buckets {
  std::vector<std::vector<std::string>> names;
  std::vector<std::vector<std::vector<int64_t>>> shapes;
  std::vector<std::vector<dopt_bucket_entry>> entries;
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<double>> f64;
  std::vector<int64_t> length;
  std::vector<DLTensor> dl;
  std::vector<dopt_bucket> b;
  bool is64 = false;

  Buckets(const std::vector<BucketSpec>& spec, bool f64_storage) : is64(f64_storage) {
    const size_t nb = spec.size();
    names.resize(nb);
    shapes.resize(nb);
    entries.resize(nb);
    f32.resize(nb);
    f64.resize(nb);
    length.resize(nb);
    dl.resize(nb);
    b.resize(nb);
    for (size_t bi = 0; bi < nb; ++bi) {
      size_t off = 0;
      for (const Param& p : spec[bi]) {
        names[bi].push_back(p.name);
        shapes[bi].push_back(p.shape);
      }
      for (size_t k = 0; k < spec[bi].size(); ++k) {
        dopt_bucket_entry e{};
        e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
        e.name = names[bi][k].c_str();
        e.param_index = static_cast<int32_t>(k);
        e.offset = off;
        e.numel = static_cast<size_t>(numel_of(shapes[bi][k]));
        e.ndim = static_cast<int32_t>(shapes[bi][k].size());
        e.shape = shapes[bi][k].data();
        entries[bi].push_back(e);
        off = (off + e.numel + 1 + 3) / 4 * 4;
      }
      length[bi] = static_cast<int64_t>(off);
      f32[bi].assign(off, 0.0f);
      f64[bi].assign(off, 0.0);
      dl[bi] = DLTensor{};
      dl[bi].data = is64 ? static_cast<void*>(f64[bi].data()) : static_cast<void*>(f32[bi].data());
      dl[bi].device = {kDLCPU, 0};
      dl[bi].ndim = 1;
      dl[bi].dtype = DLDataType{kDLFloat, static_cast<uint8_t>(is64 ? 64 : 32), 1};
      dl[bi].shape = &length[bi];
      b[bi].struct_size = DOPT_BUCKET_STRUCT_SIZE;
      b[bi].index = static_cast<int32_t>(bi);
      b[bi].flat = &dl[bi];
      b[bi].entries = entries[bi].data();
      b[bi].num_entries = entries[bi].size();
    }
  }
  Buckets(const Buckets&) = delete;
};

inline float uniform(uint64_t key) {  // splitmix64 -> [-1, 1)
  uint64_t z = key + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

// A part common to all steps and ranks (so residuals and warm starts
// matter), per-rank per-step noise, and a padding value the reducer must
// not take for a gradient.
// `ties`: values rounded to multiples of 1/4, so many |p| tie (topk's
// tie-break in index order).
inline void fill(Buckets& bs, int rank, int step, bool ties = false) {
  for (size_t bi = 0; bi < bs.b.size(); ++bi) {
    const size_t n = static_cast<size_t>(bs.length[bi]);
    std::vector<uint8_t> in_entry(n, 0);
    for (const auto& e : bs.entries[bi]) std::fill_n(in_entry.begin() + e.offset, e.numel, 1);
    for (size_t i = 0; i < n; ++i) {
      const float v = in_entry[i]
                          ? uniform((bi << 40) ^ i) +
                                0.5f * uniform((static_cast<uint64_t>(rank) << 56) ^
                                               (static_cast<uint64_t>(step) << 48) ^ (bi << 40) ^ i)
                          : 3.0f;
      bs.f32[bi][i] = ties ? std::round(v * 4.0f) / 4.0f : v;
      bs.f64[bi][i] = static_cast<double>(bs.f32[bi][i]) * (1.0 + 1e-9);  // not a float
    }
  }
}

// ---- one case ---------------------------------------------------------------

struct Case {
  std::string reducer;
  std::string options;  // YAML map without `kernels`
  std::vector<BucketSpec> buckets;
  bool f64 = false;
  bool ties = false;  // fill's quantised gradients
  int save_at = 3, steps = 6;
};

/// What a rank found; diffs are max |x - y| over all elements, `bits` the
/// count of elements differing in any bit.
struct Summary {
  double ab_diff = 0, ca_diff = 0, db_diff = 0, fresh_diff = 0, store_diff = 0;
  size_t ab_bits = 0, ca_bits = 0, db_bits = 0, store_bits = 0;
  bool same_keys = false;
  std::string keys;
  double bytes_a = 0, bytes_b = 0;
  uint64_t hash_a = 0, hash_b = 0;  // of A's / B's outputs: equal on every rank
  double ms_a = 0, ms_b = 0;        // wall time of A's / B's steps (reports only)
};

inline uint64_t fnv1a(const std::vector<double>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(double); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Diff {
  double max = 0;
  size_t bits = 0;
};
inline Diff compare(const std::vector<double>& x, const std::vector<double>& y) {
  Diff d;
  if (x.size() != y.size()) return {1e300, x.size() + y.size()};
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = std::fabs(x[i] - y[i]);
    d.max = std::max(d.max, std::isnan(a) ? 1e300 : a);
    d.bits += std::memcmp(&x[i], &y[i], sizeof(double)) != 0;
  }
  return d;
}

inline std::vector<double> entry_values(const Entry& e) {
  std::vector<double> v;
  const size_t eb = elem_bytes(e.dtype), n = e.bytes.size() / eb;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = e.bytes.data() + i * eb;
    if (e.dtype.code == kDLFloat && e.dtype.bits == 32) {
      float f;
      std::memcpy(&f, p, 4);
      v.push_back(f);
    } else if (e.dtype.code == kDLFloat && e.dtype.bits == 64) {
      double f;
      std::memcpy(&f, p, 8);
      v.push_back(f);
    } else if (e.dtype.code == kDLInt && e.dtype.bits == 64) {
      int64_t f;
      std::memcpy(&f, p, 8);
      v.push_back(static_cast<double>(f));
    } else {
      v.push_back(*p);  // bytes (a generator state)
    }
  }
  return v;
}

inline Summary run_case(const Case& c, int rank, int world, Endpoint& ep, const std::string& dir) {
  const ComponentInfo& info = ep.registry.get(DOPT_KIND_REDUCER, c.reducer);
  const auto* vt = static_cast<const dopt_reducer_v1*>(info.vtable);
  Buckets bs(c.buckets, c.f64);
  auto create = [&](const char* kernels) {
    YAML::Node y = YAML::Load(c.options);
    y["kernels"] = kernels;
    auto opts =
        std::make_shared<Options>(Options::validate(y, info.options, "<test>", "reducer.options"));
    dopt_create_args a{};
    a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    a.rank = rank;
    a.world_size = world;
    a.local_rank = rank;
    a.local_world_size = world;
    a.options = opts->c_handle();
    a.store = reinterpret_cast<dopt_store*>(ep.store.get());
    a.scope = "test/kernels";
    a.job_token = "test-token";
    a.bind_address = "127.0.0.1";
    dopt_reducer* red = nullptr;
    check_status(vt->create(&a, ep.comm->ref(), bs.b.data(), bs.b.size(), &red), c.reducer,
                 "create");
    return std::make_pair(red, opts);  // the options outlive the reducer
  };
  double reduce_ms = 0;  // reduce + wait time of `steps` (reports only)
  auto steps = [&](dopt_reducer* red, int from, int to) {
    std::vector<double> out;
    for (int s = from; s < to; ++s) {
      fill(bs, rank, s, c.ties);
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<dopt_reduce_request*> reqs(bs.b.size());
      for (size_t bi = 0; bi < bs.b.size(); ++bi)
        check_status(vt->reduce(red, &bs.b[bi], &reqs[bi]), c.reducer, "reduce");
      for (size_t bi = 0; bi < bs.b.size(); ++bi) {
        check_status(vt->wait(reqs[bi], 60000), c.reducer, "wait");
        vt->request_free(reqs[bi]);
      }
      reduce_ms +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (size_t bi = 0; bi < bs.b.size(); ++bi) {
        if (bs.is64)
          out.insert(out.end(), bs.f64[bi].begin(), bs.f64[bi].end());
        else
          out.insert(out.end(), bs.f32[bi].begin(), bs.f32[bi].end());
      }
    }
    return out;
  };
  auto save = [&](dopt_reducer* red, Store& st) {
    dopt_state_writer w{DOPT_STATE_WRITER_V1_1_STRUCT_SIZE, nullptr, &st, &store_put, nullptr};
    check_status(vt->save_state(red, &w), c.reducer, "save_state");
  };
  auto load = [&](dopt_reducer* red, const Store& st) {
    dopt_state_reader r{DOPT_STATE_READER_STRUCT_SIZE,
                        nullptr,
                        const_cast<Store*>(&st),
                        world,
                        &store_find,
                        &store_read};
    check_status(vt->load_state(red, &r), c.reducer, "load_state");
  };
  // What the host does between save and load (same world size).
  auto exchange = [&](const Store& mine, const std::string& tag) {
    const std::string prefix = dir + "/" + tag + ".rank";
    write_store(mine, prefix + std::to_string(rank));
    ep.comm->barrier().wait();
    Store merged;
    for (int r = world - 1; r >= 0; --r)
      for (auto& [k, e] : read_store(prefix + std::to_string(r)))
        if (e.kind == DOPT_STATE_SHARDED || r == rank) merged[k] = e;
    ep.comm->barrier().wait();
    std::remove((prefix + std::to_string(rank)).c_str());
    return merged;
  };

  Summary s;
  Store sa, sb;
  auto a = create("cpu");
  reduce_ms = 0;
  std::vector<double> out_a = steps(a.first, 0, c.save_at);
  save(a.first, sa);
  std::vector<double> cont_a = steps(a.first, c.save_at, c.steps);
  s.ms_a = reduce_ms;
  s.bytes_a = static_cast<double>(vt->bytes_sent(a.first));
  check_status(vt->destroy(a.first), c.reducer, "destroy");

  auto b = create("generic");
  reduce_ms = 0;
  std::vector<double> out_b = steps(b.first, 0, c.save_at);
  save(b.first, sb);
  std::vector<double> cont_b = steps(b.first, c.save_at, c.steps);
  s.ms_b = reduce_ms;
  s.bytes_b = static_cast<double>(vt->bytes_sent(b.first));
  check_status(vt->destroy(b.first), c.reducer, "destroy");

  out_a.insert(out_a.end(), cont_a.begin(), cont_a.end());
  out_b.insert(out_b.end(), cont_b.begin(), cont_b.end());
  s.hash_a = fnv1a(out_a);
  s.hash_b = fnv1a(out_b);
  Diff d = compare(out_a, out_b);
  s.ab_diff = d.max;
  s.ab_bits = d.bits;

  // The state each path saved: same keys, kinds, shapes, dtypes; values.
  s.same_keys = sa.size() == sb.size();
  for (const auto& [k, e] : sa) {
    s.keys += k + ";";
    auto it = sb.find(k);
    if (it == sb.end() || it->second.kind != e.kind || it->second.shape != e.shape ||
        it->second.dtype.code != e.dtype.code || it->second.dtype.bits != e.dtype.bits) {
      s.same_keys = false;
      continue;
    }
    Diff de = compare(entry_values(e), entry_values(it->second));
    s.store_diff = std::max(s.store_diff, de.max);
    s.store_bits += de.bits;
  }

  const Store ca = exchange(sa, "a"), cb = exchange(sb, "b");
  auto cc = create("generic");
  load(cc.first, ca);
  d = compare(steps(cc.first, c.save_at, c.steps), cont_a);
  s.ca_diff = d.max;
  s.ca_bits = d.bits;
  check_status(vt->destroy(cc.first), c.reducer, "destroy");

  auto dd = create("cpu");
  load(dd.first, cb);
  d = compare(steps(dd.first, c.save_at, c.steps), cont_b);
  s.db_diff = d.max;
  s.db_bits = d.bits;
  check_status(vt->destroy(dd.first), c.reducer, "destroy");

  auto f = create("generic");
  s.fresh_diff = compare(steps(f.first, c.save_at, c.steps), cont_a).max;
  check_status(vt->destroy(f.first), c.reducer, "destroy");
  return s;
}

inline void write_summary(std::ofstream& out, const Summary& s) {
  out << s.ab_diff << " " << s.ab_bits << " " << s.ca_diff << " " << s.ca_bits << " " << s.db_diff
      << " " << s.db_bits << " " << s.fresh_diff << " " << s.store_diff << " " << s.store_bits
      << " " << s.same_keys << " " << s.bytes_a << " " << s.bytes_b << " " << s.hash_a << " "
      << s.hash_b << " " << s.ms_a << " " << s.ms_b << "\n"
      << s.keys << "\n";
}

inline bool read_summary(std::ifstream& in, Summary& s) {
  std::string line;
  if (!std::getline(in, line)) return false;
  std::istringstream ls(line);
  ls >> s.ab_diff >> s.ab_bits >> s.ca_diff >> s.ca_bits >> s.db_diff >> s.db_bits >>
      s.fresh_diff >> s.store_diff >> s.store_bits >> s.same_keys >> s.bytes_a >> s.bytes_b >>
      s.hash_a >> s.hash_b >> s.ms_a >> s.ms_b;
  return static_cast<bool>(ls) && static_cast<bool>(std::getline(in, s.keys));
}

/// Run `cases` on `world` ranks (one endpoint per rank); result[rank][case].
inline std::vector<std::vector<Summary>> run_all(const std::vector<Case>& cases, int world) {
  char tmpl[] = "/tmp/distopt_kernels_XXXXXX";
  if (!mkdtemp(tmpl)) return {};
  const std::string dir = tmpl;
  const int port = free_port();
  auto codes = fork_ranks(
      world,
      [&](int rank) {
        setenv("OMP_NUM_THREADS", "1", 1);  // ranks share this machine's cores
        auto ep = make_endpoint("tcp", rank, world, port);
        std::ofstream out(dir + "/summary" + std::to_string(rank), std::ios::trunc);
        out.precision(17);
        for (const Case& c : cases) write_summary(out, run_case(c, rank, world, *ep, dir));
        out.close();
        ep->comm->barrier().wait();
        return 0;
      },
      std::chrono::seconds(240));
  std::vector<std::vector<Summary>> res(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    if (codes[static_cast<size_t>(r)] != 0) return {};
    std::ifstream in(dir + "/summary" + std::to_string(r));
    for (size_t i = 0; i < cases.size(); ++i) {
      Summary s;
      if (!read_summary(in, s)) return {};
      res[static_cast<size_t>(r)].push_back(s);
    }
    std::remove((dir + "/summary" + std::to_string(r)).c_str());
  }
  std::remove(dir.c_str());
  return res;
}

}  // namespace distopt::test::kernels
