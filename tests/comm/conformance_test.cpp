// Conformance: the same checks over every communicator the registry
// discovers in DISTOPT_PLUGIN_DIR (tcp, ucx when built; device-only ones
// such as nccl are skipped), or only over DISTOPT_CONFORMANCE_COMM when set,
// with the options DISTOPT_CONFORMANCE_OPTIONS gives (a YAML map; ctest runs
// comm_conformance_test_<name>* entries that way).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm_helpers.hpp"
#include "distopt/error.hpp"

using namespace distopt;
using namespace distopt::test;

namespace {

/// The communicators that accept host memory (this suite's tensors are
/// kDLCPU; a device-only one, e.g. nccl, has its own tests in tests/nccl).
std::vector<std::string> communicators() {
  if (const char* only = std::getenv("DISTOPT_CONFORMANCE_COMM"); only && *only) return {only};
  PluginRegistry reg;
  reg.discover({plugin_dir()});
  std::vector<std::string> names;
  for (const auto& c : reg.components()) {
    if (c.kind != DOPT_KIND_COMMUNICATOR) continue;
    if (c.devices & DOPT_DEVICE_BIT(kDLCPU))
      names.push_back(c.name);
    else
      MESSAGE("skipping communicator '" << c.name << "': it accepts " << devices_text(c.devices)
                                        << " memory only");
  }
  return names;
}

/// DISTOPT_CONFORMANCE_BIG_MIB, else 64: the size of the large allreduce.
size_t big_mib() {
  const char* v = std::getenv("DISTOPT_CONFORMANCE_BIG_MIB");
  const long n = v && *v ? std::strtol(v, nullptr, 10) : 64;
  return n >= 1 ? static_cast<size_t>(n) : 64;
}

/// DISTOPT_CONFORMANCE_OPTIONS (for DISTOPT_CONFORMANCE_COMM), else "{}".
std::string options() {
  const char* o = std::getenv("DISTOPT_CONFORMANCE_OPTIONS");
  return o && *o ? o : "{}";
}

}  // namespace

TEST_CASE("conformance: every discovered communicator") {
  auto names = communicators();
  REQUIRE_MESSAGE(!names.empty(), "no communicator found in " << plugin_dir());
  if (!std::getenv("DISTOPT_CONFORMANCE_COMM"))
    CHECK(std::find(names.begin(), names.end(), "tcp") != names.end());
  for (const auto& name : names) {
    CAPTURE(name);
    const int port = free_port();
    auto codes = fork_ranks(
        2,
        [&](int me) {
          auto ep = make_endpoint(name, me, 2, port, options());
          Communicator& c = *ep->comm;
          if (c.rank() != me || c.world_size() != 2) return 1;
          // allreduce sum float32
          std::vector<float> a(1001);
          for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * (me + 1);
          int64_t s1;
          DLTensor t = make_dltensor(a.data(), 1001, dl_f32(), &s1);
          c.allreduce(t, t, DOPT_REDUCE_SUM).wait();
          for (size_t i = 0; i < a.size(); ++i)
            if (a[i] != 3.0f * static_cast<float>(i)) return 2;
          // broadcast from rank 1
          std::vector<float> b(333, me == 1 ? 5.0f : 0.0f);
          int64_t s2;
          DLTensor tb = make_dltensor(b.data(), 333, dl_f32(), &s2);
          c.broadcast(tb, 1).wait();
          if (b[0] != 5.0f || b[332] != 5.0f) return 3;
          // barrier
          c.barrier().wait();
          // a bad argument: an error, not a crash
          std::vector<float> small(3);
          int64_t s3;
          DLTensor ts = make_dltensor(small.data(), 3, dl_f32(), &s3);
          try {
            c.allreduce(t, ts, DOPT_REDUCE_SUM).wait();
            return 4;
          } catch (const ComponentError& e) {
            if (e.status() != DOPT_ERR_INVALID_ARGUMENT) return 5;
          }
          c.barrier().wait();  // still usable
          return 0;
        },
        std::chrono::seconds(120));
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
  }
}

namespace {

// Small integers (times the world size, so averages are exact) in each
// reducible dtype: every result must match the reference exactly.
struct Dt {
  const char* name;
  DLDataType dl;
};
const Dt kDtypes[] = {{"float32", {kDLFloat, 32, 1}},   {"float64", {kDLFloat, 64, 1}},
                      {"bfloat16", {kDLBfloat, 16, 1}}, {"float16", {kDLFloat, 16, 1}},
                      {"int32", {kDLInt, 32, 1}},       {"int64", {kDLInt, 64, 1}}};
const dopt_reduce_op kOps[] = {DOPT_REDUCE_SUM, DOPT_REDUCE_AVG, DOPT_REDUCE_MIN, DOPT_REDUCE_MAX};

void put(DLDataType t, void* p, size_t i, double v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (t.code == kDLFloat && t.bits == 32) {
    static_cast<float*>(p)[i] = f;
  } else if (t.code == kDLFloat && t.bits == 64) {
    static_cast<double*>(p)[i] = v;
  } else if (t.code == kDLInt && t.bits == 32) {
    static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
  } else if (t.code == kDLInt && t.bits == 64) {
    static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
  } else if (t.code == kDLBfloat) {
    static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);  // exact for small integers
  } else {                                                          // float16, |v| < 2048
    const uint32_t sign = (u >> 16) & 0x8000u, exp = ((u >> 23) & 0xffu) - 127 + 15;
    static_cast<uint16_t*>(p)[i] =
        f == 0 ? static_cast<uint16_t>(sign)
               : static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3ffu));
  }
}

double get(DLDataType t, const void* p, size_t i) {
  if (t.code == kDLFloat && t.bits == 32) return static_cast<const float*>(p)[i];
  if (t.code == kDLFloat && t.bits == 64) return static_cast<const double*>(p)[i];
  if (t.code == kDLInt && t.bits == 32) return static_cast<const int32_t*>(p)[i];
  if (t.code == kDLInt && t.bits == 64)
    return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  uint32_t u;
  if (t.code == kDLBfloat) {
    u = uint32_t(h) << 16;
  } else {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    u = (e == 0 && m == 0) ? sign : sign | ((e - 15 + 127) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

double value(int n, int r, size_t i) {
  return n * static_cast<double>((i * 7 + r * 3) % 11) - 5 * n;
}

double reference(int n, size_t i, dopt_reduce_op op) {
  double acc = value(n, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = value(n, r, i);
    acc = op == DOPT_REDUCE_MIN   ? std::min(acc, v)
          : op == DOPT_REDUCE_MAX ? std::max(acc, v)
                                  : acc + v;
  }
  return op == DOPT_REDUCE_AVG ? acc / n : acc;
}

// Every operation x dtype x op x count on one rank; returns a failure text or "".
std::string every_operation(Communicator& c, int me, int n) {
  for (const Dt& d : kDtypes)
    for (dopt_reduce_op op : kOps)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{70001}}) {
        const std::string where = std::string(d.name) + " op " + std::to_string(op) + " count " +
                                  std::to_string(count) + ": ";
        const size_t esz = d.dl.bits / 8;
        std::vector<char> in(count * n * esz + 8), out(count * n * esz + 8);
        for (size_t i = 0; i < count * n; ++i) put(d.dl, in.data(), i, value(n, me, i));
        int64_t s1, s2;
        DLTensor ti = make_dltensor(in.data(), static_cast<int64_t>(count), d.dl, &s1);
        DLTensor to = make_dltensor(out.data(), static_cast<int64_t>(count), d.dl, &s2);
        c.allreduce(ti, to, op).wait();
        for (size_t i = 0; i < count; ++i)
          if (get(d.dl, out.data(), i) != reference(n, i, op)) return where + "allreduce";
        DLTensor tall = make_dltensor(in.data(), static_cast<int64_t>(count * n), d.dl, &s1);
        c.reduce_scatter(tall, to, op).wait();
        for (size_t i = 0; i < count; ++i)
          if (get(d.dl, out.data(), i) != reference(n, me * count + i, op))
            return where + "reduce_scatter";
        if (op != DOPT_REDUCE_SUM) continue;
        // allgather of this rank's shard of the reduced vector; broadcast from the last rank.
        std::vector<char> all(count * n * esz + 8);
        int64_t s3;
        DLTensor tg = make_dltensor(all.data(), static_cast<int64_t>(count * n), d.dl, &s3);
        c.allgather(to, tg).wait();
        for (size_t i = 0; i < count * n; ++i)
          if (get(d.dl, all.data(), i) != reference(n, i, op)) return where + "allgather";
        std::vector<char> b(count * esz + 8);
        for (size_t i = 0; i < count; ++i)
          put(d.dl, b.data(), i, me == n - 1 ? value(n, me, i) : 0);
        DLTensor tb = make_dltensor(b.data(), static_cast<int64_t>(count), d.dl, &s3);
        c.broadcast(tb, n - 1).wait();
        for (size_t i = 0; i < count; ++i)
          if (get(d.dl, b.data(), i) != value(n, n - 1, i)) return where + "broadcast";
      }
  c.barrier().wait();
  return "";
}

}  // namespace

TEST_CASE(
    "conformance: every operation, dtype, op and count (0/1/7/non-divisible/large) on 2-4 ranks, "
    "and a 64 MiB allreduce") {
  for (const auto& name : communicators()) {
    for (int n = 2; n <= 4; ++n) {
      CAPTURE(name);
      CAPTURE(n);
      const int port = free_port();
      auto codes = fork_ranks(
          n,
          [&](int me) {
            auto ep = make_endpoint(name, me, n, port, options());
            const std::string bad = every_operation(*ep->comm, me, n);
            if (!bad.empty()) {
              fprintf(stderr, "%s rank %d: %s\n", name.c_str(), me, bad.c_str());
              return 1;
            }
            // 64 MiB of float32: the bandwidth path, many pipeline segments
            // (DISTOPT_CONFORMANCE_BIG_MIB: less for a slow test transport).
            std::vector<float> big(big_mib() << 18);
            for (size_t i = 0; i < big.size(); ++i)
              big[i] = static_cast<float>((i % 1000) * (me + 1));
            int64_t s;
            DLTensor t = make_dltensor(big.data(), static_cast<int64_t>(big.size()), dl_f32(), &s);
            ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
            const float k = static_cast<float>(n * (n + 1) / 2);
            for (size_t i = 0; i < big.size(); ++i)
              if (big[i] != static_cast<float>(i % 1000) * k) {
                fprintf(stderr, "%s rank %d: %zu MiB allreduce wrong at %zu\n", name.c_str(), me,
                        big_mib(), i);
                return 2;
              }
            return 0;
          },
          std::chrono::seconds(300));
      for (int r = 0; r < n; ++r) CHECK(codes[r] == 0);
    }
  }
}
