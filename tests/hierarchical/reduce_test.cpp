// The `hierarchical` reducer on 3-4 real ranks (tcp on loopback), driven
// through its C vtable with hand-made buckets. Each forked rank sets its own
// DISTOPT_NODE_ID, so one host forms 2 nodes x 2 ranks, 2+1, 3+1 or an
// interleaved layout. Checked against references, not against itself:
//  - bitwise the flat `mean` reducer on integer-valued data (ring and
//    leader; bucket sizes 0, 1, 7, 13, 2^20 + 3; float32, float64, bfloat16);
//  - the bytes it reports per rank within and across nodes against the
//    ring formulas, and (shared memory off) against what tcp counted on its
//    sockets; across nodes 1/L of a flat ring between the nodes;
//  - with `inner: powersgd` (leader variant): bitwise what a flat powersgd
//    job of one rank per node computes from the nodes' mean gradients.
#include <ATen/Parallel.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
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
#include "distopt/sdk/base/traffic.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

using Shapes = std::vector<std::vector<int64_t>>;  // one bucket's entries

struct Spec {
  int world = 4;
  std::vector<std::string> nodes;  // DISTOPT_NODE_ID of each rank
  std::string reducer;             // the reducer section under test (YAML)
  std::vector<Shapes> buckets;
  int steps = 1;
  at::ScalarType dtype = at::kFloat;
  bool shm = true;  // false: tcp counts every byte on its sockets
  /// Reference runs: rank r's input is the mean of these ranks' inputs.
  std::vector<std::vector<int>> average_of;
};

// One bucket's outcome on one rank at one step.
struct Out {
  double intra = 0, inter = 0, comm = 0, mean_bytes = 0;  // sent during this reduction
  std::vector<double> value, mean;                        // the reducer's result, mean's
};

int64_t numel_of(const Shapes& s) {
  int64_t n = 0;
  for (const auto& sh : s) {
    int64_t k = 1;
    for (int64_t d : sh) k *= d;
    n += k;
  }
  return n;
}

// Integer-valued inputs in [-20, 20]: sums of a few ranks stay exact in every dtype.
double input(int rank, int step, size_t bucket, int64_t i) {
  return static_cast<double>(((rank + 1) * 131 + step * 17 + static_cast<int64_t>(bucket) * 7 +
                              i * 3 + (i * i) % 5) %
                             41) -
         20.0;
}

// A bucket of the given entries over a tensor of `dtype` (entries packed back to back).
struct Bucket {
  at::Tensor flat;
  distopt::sdk::DLView view;
  std::vector<std::string> names;
  std::vector<dopt_bucket_entry> entries;
  dopt_bucket b{};
  Bucket(const Shapes& shapes, size_t index, at::ScalarType dtype)
      : flat(at::zeros({numel_of(shapes)}, at::TensorOptions().dtype(dtype))), view(flat) {
    size_t off = 0;
    for (size_t k = 0; k < shapes.size(); ++k)
      names.push_back("b" + std::to_string(index) + ".p" + std::to_string(k));
    for (size_t k = 0; k < shapes.size(); ++k) {
      dopt_bucket_entry e{};
      e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
      e.name = names[k].c_str();
      e.param_index = static_cast<int32_t>(k);
      e.offset = off;
      e.numel = static_cast<size_t>(numel_of({shapes[k]}));
      e.ndim = static_cast<int32_t>(shapes[k].size());
      e.shape = shapes[k].data();
      entries.push_back(e);
      off += e.numel;
    }
    b.struct_size = DOPT_BUCKET_STRUCT_SIZE;
    b.index = static_cast<int32_t>(index);
    b.flat = view.get();
    b.entries = entries.data();
    b.num_entries = entries.size();
  }
};

struct Reducer {
  const dopt_reducer_v1* vt = nullptr;
  dopt_reducer* r = nullptr;
  void reduce(const dopt_bucket& b) {
    dopt_reduce_request* req = nullptr;
    distopt::check_status(vt->reduce(r, &b, &req), "reducer", "reduce");
    distopt::check_status(vt->wait(req, 60000), "reducer", "wait");
    vt->request_free(req);
  }
};

double metric(const char* name) { return distopt::metrics_snapshot()[name]; }

std::vector<double> doubles(const at::Tensor& t) {
  at::Tensor d = t.to(at::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

int child(const Spec& s, int rank, int port, const std::string& path) {
  using namespace distopt;
  setenv("OMP_NUM_THREADS", "1", 1);
  if (!s.nodes.empty()) setenv("DISTOPT_NODE_ID", s.nodes[rank].c_str(), 1);
  at::set_num_threads(1);
  std::ostringstream y;
  y << plugins_and_world_yaml(s.world, port)
    << "communicator: {name: tcp, options: {shm: " << (s.shm ? "true" : "false")
    << "}}\nreducer: " << s.reducer << "\n";
  Runtime rt = rank_runtime(y.str(), rank, s.world, "hier.yaml");
  // The validated reducer options, its `inner:` attached (as Runtime does).
  const ValidatedJob v = validate_job(rt.config(), rt.registry(), s.world);

  std::vector<std::unique_ptr<Bucket>> buckets, means;
  std::vector<dopt_bucket> descs;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    buckets.push_back(std::make_unique<Bucket>(s.buckets[b], b, s.dtype));
    means.push_back(std::make_unique<Bucket>(s.buckets[b], b, s.dtype));
    descs.push_back(buckets.back()->b);
  }
  auto make = [&](const std::string& name, const Options& opts, const std::string& scope) {
    const ComponentInfo& info = rt.registry().get(DOPT_KIND_REDUCER, name);
    dopt_create_args a{};
    a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    a.rank = rank;
    a.world_size = s.world;
    a.local_rank = rank;
    a.local_world_size = s.world;
    a.options = opts.c_handle();
    a.scope = scope.c_str();
    Reducer red;
    red.vt = static_cast<const dopt_reducer_v1*>(info.vtable);
    check_status(red.vt->create(&a, rt.communicator().ref(), descs.data(), descs.size(), &red.r),
                 name, "create");
    return red;
  };
  const Options no_options = Options::validate(YAML::Node(), {}, "hier.yaml", "mean");
  Reducer tested = make(rt.config().reducer.name, v.reducer, "test/reducer");
  Reducer mean = make("mean", no_options, "test/mean");

  std::ofstream out(path, std::ios::binary);
  for (int step = 0; step < s.steps; ++step)
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      const int64_t n = buckets[b]->flat.numel();
      at::Tensor in = at::empty({n}, at::kDouble);
      double* px = in.data_ptr<double>();
      for (int64_t i = 0; i < n; ++i) {
        double x = 0;
        if (s.average_of.empty()) {
          x = input(rank, step, b, i);
        } else {
          for (int r : s.average_of[rank]) x += input(r, step, b, i);
          x /= static_cast<double>(s.average_of[rank].size());
        }
        px[i] = x;
      }
      buckets[b]->flat.copy_(in);
      means[b]->flat.copy_(in);
      const double m0 = mean.vt->bytes_sent(mean.r);
      mean.reduce(means[b]->b);
      const double intra0 = metric("hierarchical.intra_bytes"),
                   inter0 = metric("hierarchical.inter_bytes"), comm0 = metric("comm.bytes_sent");
      tested.reduce(buckets[b]->b);
      std::vector<double> rec = {
          metric("hierarchical.intra_bytes") - intra0, metric("hierarchical.inter_bytes") - inter0,
          metric("comm.bytes_sent") - comm0, static_cast<double>(mean.vt->bytes_sent(mean.r)) - m0};
      auto val = doubles(buckets[b]->flat), mv = doubles(means[b]->flat);
      rec.insert(rec.end(), val.begin(), val.end());
      rec.insert(rec.end(), mv.begin(), mv.end());
      out.write(reinterpret_cast<const char*>(rec.data()),
                static_cast<std::streamsize>(rec.size() * sizeof(double)));
    }
  out.close();
  check_status(tested.vt->destroy(tested.r), "reducer", "destroy");
  check_status(mean.vt->destroy(mean.r), "mean", "destroy");
  rt.barrier();
  return 0;
}

// result[rank][step * buckets + bucket]
std::vector<std::vector<Out>> run(const Spec& s) {
  TempDir dir("distopt_hier");
  const int port = random_port();
  auto codes = fork_ranks(
      s.world,
      [&](int rank) { return child(s, rank, port, dir / ("rank" + std::to_string(rank))); },
      std::chrono::seconds(240));
  std::vector<std::vector<Out>> res(s.world);
  for (int r = 0; r < s.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    const auto all = read_doubles(dir / ("rank" + std::to_string(r)));
    size_t at = 0;
    for (int step = 0; step < s.steps; ++step)
      for (const Shapes& sh : s.buckets) {
        const auto n = static_cast<size_t>(numel_of(sh));
        REQUIRE(all.size() >= at + 4 + 2 * n);
        Out o;
        o.intra = all[at];
        o.inter = all[at + 1];
        o.comm = all[at + 2];
        o.mean_bytes = all[at + 3];
        o.value.assign(all.begin() + static_cast<long>(at + 4),
                       all.begin() + static_cast<long>(at + 4 + n));
        o.mean.assign(all.begin() + static_cast<long>(at + 4 + n),
                      all.begin() + static_cast<long>(at + 4 + 2 * n));
        at += 4 + 2 * n;
        res[r].push_back(std::move(o));
      }
  }
  return res;
}

// Exact equality (max_abs_diff is infinity for two empty vectors).
bool same(const std::vector<double>& a, const std::vector<double>& b) { return a == b; }

std::vector<std::string> split_nodes(const std::string& list) {
  std::vector<std::string> v;
  std::stringstream ss(list);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
  return v;
}

// The node layout the test expects (nodes numbered by their lowest rank).
struct Nodes {
  std::vector<int> node_of, local_of, size_of_node;
  explicit Nodes(const std::vector<std::string>& names) {
    std::vector<std::string> seen;
    for (const auto& n : names) {
      auto it = std::find(seen.begin(), seen.end(), n);
      const int k = static_cast<int>(it - seen.begin());
      if (it == seen.end()) {
        seen.push_back(n);
        size_of_node.push_back(0);
      }
      node_of.push_back(k);
      local_of.push_back(size_of_node[k]++);
    }
  }
  int count() const { return static_cast<int>(size_of_node.size()); }
  int largest() const { return *std::max_element(size_of_node.begin(), size_of_node.end()); }
};

// Bytes rank r sends for a bucket of n elements of esz bytes, by the ring
// model: a reduce-scatter / allgather of L blocks sends L - 1 of them, a
// chain broadcast the whole buffer from every rank but the last.
std::pair<double, double> expected_bytes(const Nodes& l, int r, const std::string& variant,
                                         int64_t n, int esz) {
  if (n == 0) return {0, 0};
  const int L = l.size_of_node[l.node_of[r]], j = l.local_of[r], N = l.count();
  if (variant == "ring") {
    const int S = l.largest();
    const int64_t c = (n + S - 1) / S, slots = (S + L - 1) / L;
    int held = 0;
    for (int k = 0; k < S; ++k) held += k % L == j;
    const double intra = L > 1 ? 2.0 * (L - 1) * slots * c * esz : 0;
    const double inter =
        N > 1 ? held * static_cast<double>(distopt::sdk::ring_allreduce_bytes(c * esz, N)) : 0;
    return {intra, inter};
  }
  const int64_t c = (n + L - 1) / L;
  double intra = 0;
  if (L > 1)
    intra = static_cast<double>((L - 1) * c * esz + (j ? c * esz : 0) + (j < L - 1 ? n * esz : 0));
  const double inter =
      j == 0 && N > 1 ? static_cast<double>(distopt::sdk::ring_allreduce_bytes(n * esz, N)) : 0;
  return {intra, inter};
}

void check_exact_mean(const std::string& node_list, const std::string& variant,
                      at::ScalarType dtype = at::kFloat, bool shm = true) {
  Spec s;
  s.nodes = split_nodes(node_list);
  s.world = static_cast<int>(s.nodes.size());
  s.reducer = "{name: hierarchical, options: {variant: " + variant + "}}";
  s.buckets = {{{0}}, {{1}}, {{7}}, {{13}}, {{3, 4}, {1}}, {{1024}}, {{(1 << 20) + 3}}};
  s.steps = 2;
  s.dtype = dtype;
  s.shm = shm;
  CAPTURE(node_list);
  CAPTURE(variant);
  CAPTURE(dtype);
  CAPTURE(shm);
  const auto res = run(s);
  const Nodes l(s.nodes);
  const int esz = static_cast<int>(c10::elementSize(dtype));
  for (int r = 0; r < s.world; ++r)
    for (size_t k = 0; k < res[r].size(); ++k) {
      CAPTURE(r);
      CAPTURE(k);
      const Out& o = res[r][k];
      const int64_t n = static_cast<int64_t>(o.value.size());
      CHECK(same(o.value, o.mean));           // bitwise the flat mean
      CHECK(same(o.value, res[0][k].value));  // and the same on every rank
      if (n > 0) CHECK(o.mean != std::vector<double>(o.mean.size(), 0.0));  // not trivially
      const auto [intra, inter] = expected_bytes(l, r, variant, n, esz);
      CHECK(o.intra == intra);
      CHECK(o.inter == inter);
      // Shared memory off and every block even: tcp's socket bytes are the model's.
      if (!shm && n % (2 * l.largest()) == 0 && n > 0) CHECK(o.comm == intra + inter);
    }
}

}  // namespace

TEST_CASE("2 nodes x 2 ranks: bitwise the flat mean on integer-valued data, both variants") {
  check_exact_mean("a,a,b,b", "ring");
  check_exact_mean("a,a,b,b", "leader");
}

TEST_CASE("unequal and interleaved nodes: 2+1, 3+1, and nodes a,b,a,b") {
  check_exact_mean("a,a,b", "ring");
  check_exact_mean("a,a,b", "leader");
  check_exact_mean("n0,n0,n0,n1", "ring");
  check_exact_mean("n0,n0,n0,n1", "leader");
  check_exact_mean("a,b,a,b", "ring");
}

TEST_CASE("float64 and bfloat16 buckets, and one node or one rank per node") {
  check_exact_mean("a,a,b,b", "ring", at::kDouble);
  check_exact_mean("a,a,b,b", "leader", at::kBFloat16);
  check_exact_mean("x,x,x", "ring");    // a single node: no cross-node step
  check_exact_mean("a,b,c", "leader");  // one rank per node: no intra-node step
}

TEST_CASE("bytes: the ring model is what tcp sends; across nodes 1/L of a flat ring") {
  // Shared memory off: every byte goes through tcp's sockets, where it counts them.
  check_exact_mean("a,a,b,b", "ring", at::kFloat, false);
  check_exact_mean("a,a,b,b", "leader", at::kFloat, false);
  // 2 x 2, ring, a bucket of 1 MiB + 12 bytes: per rank, across nodes, half
  // of what a flat ring between the 2 nodes sends per node, and less than
  // 1/L of what the flat `mean` over 4 ranks sends per rank.
  Spec s;
  s.nodes = {"a", "a", "b", "b"};
  s.reducer = "{name: hierarchical}";
  s.buckets = {{{(1 << 18) + 3}}};
  const auto res = run(s);
  const double bytes = 4.0 * ((1 << 18) + 3);
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const Out& o = res[r][0];
    const double flat_between_nodes =
        static_cast<double>(distopt::sdk::ring_allreduce_bytes(static_cast<uint64_t>(bytes), 2));
    CHECK(std::abs(o.inter - flat_between_nodes / 2) <= 8);  // padding: at most 2 floats
    CHECK(o.mean_bytes == 1.5 * bytes);                      // flat ring over 4 ranks
    CHECK(o.inter * 2 < o.mean_bytes);
    MESSAGE("rank " << r << ": within the node " << o.intra << " B, across nodes " << o.inter
                    << " B; flat mean " << o.mean_bytes << " B");
  }
}

TEST_CASE("inner powersgd between the leaders: what flat powersgd computes on the node means") {
  const std::string psgd =
      "{name: powersgd, options: {rank: 2, start_iter: 1, min_compression_rate: 0}}";
  // Matrices (compressed) and vectors (sent whole), in two buckets.
  const std::vector<Shapes> buckets = {{{8, 6}, {6}, {5, 4}}, {{7, 3}, {3}}};
  Spec h;
  h.nodes = {"a", "a", "b", "b"};
  h.reducer = "{name: hierarchical, options: {variant: leader}, inner: " + psgd + "}";
  h.buckets = buckets;
  h.steps = 4;
  Spec ref;  // one rank per node, fed the node's mean gradient
  ref.world = 2;
  ref.reducer = psgd;
  ref.buckets = buckets;
  ref.steps = 4;
  ref.average_of = {{0, 1}, {2, 3}};
  const auto hr = run(h), rr = run(ref);
  const Nodes l(h.nodes);
  bool lossy = false;
  for (int r = 0; r < 4; ++r)
    for (size_t k = 0; k < hr[r].size(); ++k) {
      CAPTURE(r);
      CAPTURE(k);
      CHECK(same(hr[r][k].value, rr[l.node_of[r]][k].value));
      lossy = lossy || !same(hr[r][k].value, hr[r][k].mean);
      // Across nodes: the inner's traffic, on the leaders only.
      CHECK((hr[r][k].inter > 0) == (l.local_of[r] == 0));
    }
  CHECK(lossy);  // the inner compressed (rank 2 of 8 x 6 is not exact)
  // Its first step is a plain average (start_iter 1): the exact mean.
  for (int r = 0; r < 4; ++r) CHECK(same(hr[r][0].value, hr[r][0].mean));
}

// The division after the node sums is a libtorch op on the bucket's device
// (any device; a 0-dim divisor there): on 3 ranks (x / 3 rounds) it must
// stay tcp's AVG for the dtypes the tests above leave out: float16 (widened
// to float32, rounded once) and integers (truncated).
TEST_CASE("float16, int32 and int64 buckets on 3 ranks: the division is tcp's AVG") {
  check_exact_mean("a,a,b", "ring", at::kHalf);
  check_exact_mean("a,a,b", "leader", at::kInt);
  check_exact_mean("a,b,b", "ring", at::kLong);
}
