// The `tcp` communicator, loaded through the plugin registry, on 1-4 real
// processes over loopback: every collective against a reference computed
// locally from the same seeded data, point-to-point, split, bad arguments,
// timeouts, a rank that dies mid-allreduce, and peers without the job token.
// The collective tests run twice: over the shared-memory transport (all ranks
// are on this host; small segments so tensors stream through many rounds)
// and with `shm: false` (the TCP ring).
#include <arpa/inet.h>
#include <dirent.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "comm_faults.hpp"
#include "comm_helpers.hpp"
#include "distopt/error.hpp"

using namespace distopt;
using namespace distopt::test;

namespace {

// ---------------------------------------------------------------- dtypes ---

struct TypeInfo {
  const char* name;
  DLDataType dl;
  size_t size;
  double tol;  // relative tolerance for averages of integer data
};
const TypeInfo kTypes[] = {
    {"float32", {kDLFloat, 32, 1}, 4, 1e-6},   {"float64", {kDLFloat, 64, 1}, 8, 1e-12},
    {"bfloat16", {kDLBfloat, 16, 1}, 2, 1e-2}, {"float16", {kDLFloat, 16, 1}, 2, 2e-3},
    {"int32", {kDLInt, 32, 1}, 4, 0},          {"int64", {kDLInt, 64, 1}, 8, 0},
};
const dopt_reduce_op kOps[] = {DOPT_REDUCE_SUM, DOPT_REDUCE_AVG, DOPT_REDUCE_MIN, DOPT_REDUCE_MAX};
const char* op_name(dopt_reduce_op op) {
  return op == DOPT_REDUCE_SUM   ? "sum"
         : op == DOPT_REDUCE_AVG ? "avg"
         : op == DOPT_REDUCE_MIN ? "min"
                                 : "max";
}

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float ffrom(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Test-side conversions (independent of the plugin's kernels).
uint16_t to_bf16(float f) {
  uint32_t u = fbits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) { return ffrom(uint32_t(h) << 16); }
uint16_t to_f16(float f) {  // normal numbers and zero only (test data is small)
  if (f == 0.0f) return std::signbit(f) ? 0x8000 : 0;
  uint32_t u = fbits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  uint32_t m = mant >> 13, rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1))) ++m;
  if (m == 0x400u) m = 0, ++exp;
  return static_cast<uint16_t>(sign | (uint32_t(exp) << 10) | m);
}
float from_f16(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0 && mant == 0) return ffrom(sign);
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mant), -24);
  return ffrom(sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
}

void put(const TypeInfo& t, void* buf, size_t i, double v) {
  switch (t.dl.code == kDLInt ? t.size * 10 : t.dl.code == kDLBfloat ? 3 : t.size) {
    case 4:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case 8:
      static_cast<double*>(buf)[i] = v;
      break;
    case 3:
      static_cast<uint16_t*>(buf)[i] = to_bf16(static_cast<float>(v));
      break;
    case 2:
      static_cast<uint16_t*>(buf)[i] = to_f16(static_cast<float>(v));
      break;
    case 40:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    default:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
  }
}
double get(const TypeInfo& t, const void* buf, size_t i) {
  switch (t.dl.code == kDLInt ? t.size * 10 : t.dl.code == kDLBfloat ? 3 : t.size) {
    case 4:
      return static_cast<const float*>(buf)[i];
    case 8:
      return static_cast<const double*>(buf)[i];
    case 3:
      return from_bf16(static_cast<const uint16_t*>(buf)[i]);
    case 2:
      return from_f16(static_cast<const uint16_t*>(buf)[i]);
    case 40:
      return static_cast<const int32_t*>(buf)[i];
    default:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
  }
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Small integers in [-8, 8]: exact in every dtype, sums of 4 ranks too.
double ival(uint64_t seed, int rank, size_t i) {
  return static_cast<double>(
      static_cast<int>(mix(seed * 1315423911u + uint64_t(rank) * 0x10001ull + i * 7919u) % 17) - 8);
}
// Uniform floats in [-1, 1) for the float32/float64 sums.
double fval(uint64_t seed, int rank, size_t i) {
  return static_cast<double>(mix(seed * 2654435761u + uint64_t(rank) * 0x20003ull + i * 104729u) >>
                             11) *
             0x1.0p-52 -
         1.0;
}

double reference(const TypeInfo& t, dopt_reduce_op op, int n, uint64_t seed, size_t i,
                 bool floats) {
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    double v = floats ? fval(seed, r, i) : ival(seed, r, i);
    if (r == 0)
      acc = v;
    else if (op == DOPT_REDUCE_MIN)
      acc = std::min(acc, v);
    else if (op == DOPT_REDUCE_MAX)
      acc = std::max(acc, v);
    else
      acc += v;
  }
  if (op == DOPT_REDUCE_AVG) {
    if (t.dl.code == kDLInt) return std::trunc(acc / n);  // integer average truncates toward zero
    return acc / n;
  }
  return acc;
}

bool close_enough(const TypeInfo& t, double got, double want, bool floats, int n) {
  if (t.dl.code == kDLInt) return got == want;
  double tol = floats ? (t.size == 4 ? 1e-5 : 1e-12) * n : t.tol;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// Returns "" on success, else a description of the first mismatch.
std::string check_allreduce(Communicator& c, const TypeInfo& t, dopt_reduce_op op, size_t count,
                            bool inplace, bool floats, uint64_t seed) {
  const int n = c.world_size(), me = c.rank();
  std::vector<char> send(count * t.size + 1), recv(count * t.size + 1);
  for (size_t i = 0; i < count; ++i)
    put(t, send.data(), i, floats ? fval(seed, me, i) : ival(seed, me, i));
  int64_t s1, s2;
  DLTensor st = make_dltensor(send.data(), static_cast<int64_t>(count), t.dl, &s1);
  DLTensor rt =
      make_dltensor(inplace ? send.data() : recv.data(), static_cast<int64_t>(count), t.dl, &s2);
  c.allreduce(st, rt, op).wait();
  const char* out = inplace ? send.data() : recv.data();
  for (size_t i = 0; i < count; ++i) {
    double want = reference(t, op, n, seed, i, floats);
    double got = get(t, out, i);
    if (!close_enough(t, got, want, floats, n)) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "allreduce %s %s count=%zu inplace=%d rank %d: element %zu = %.9g, expected %.9g",
               t.name, op_name(op), count, inplace, me, i, got, want);
      return msg;
    }
  }
  return "";
}

std::string check_reduce_scatter(Communicator& c, const TypeInfo& t, dopt_reduce_op op,
                                 size_t block, uint64_t seed) {
  const int n = c.world_size(), me = c.rank();
  std::vector<char> send(block * n * t.size + 1), recv(block * t.size + 1);
  for (size_t i = 0; i < block * n; ++i) put(t, send.data(), i, ival(seed, me, i));
  int64_t s1, s2;
  DLTensor st = make_dltensor(send.data(), static_cast<int64_t>(block * n), t.dl, &s1);
  DLTensor rt = make_dltensor(recv.data(), static_cast<int64_t>(block), t.dl, &s2);
  c.reduce_scatter(st, rt, op).wait();
  for (size_t i = 0; i < block; ++i) {
    double want = reference(t, op, n, seed, me * block + i, false);
    double got = get(t, recv.data(), i);
    if (!close_enough(t, got, want, false, n))
      return std::string("reduce_scatter ") + t.name + " " + op_name(op) +
             " block=" + std::to_string(block) + " rank " + std::to_string(me) + ": element " +
             std::to_string(i) + " = " + std::to_string(got) + ", expected " + std::to_string(want);
  }
  return "";
}

std::string check_allgather(Communicator& c, const TypeInfo& t, size_t block, uint64_t seed) {
  const int n = c.world_size(), me = c.rank();
  std::vector<char> send(block * t.size + 1), recv(block * n * t.size + 1);
  for (size_t i = 0; i < block; ++i) put(t, send.data(), i, ival(seed, me, i));
  int64_t s1, s2;
  DLTensor st = make_dltensor(send.data(), static_cast<int64_t>(block), t.dl, &s1);
  DLTensor rt = make_dltensor(recv.data(), static_cast<int64_t>(block * n), t.dl, &s2);
  c.allgather(st, rt).wait();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < block; ++i)
      if (get(t, recv.data(), r * block + i) != ival(seed, r, i))
        return std::string("allgather ") + t.name + " block=" + std::to_string(block) + " rank " +
               std::to_string(me) + ": block " + std::to_string(r) + " element " +
               std::to_string(i) + " differs";
  return "";
}

std::string check_broadcast(Communicator& c, int root, size_t count, uint64_t seed) {
  const TypeInfo& t = kTypes[0];
  std::vector<char> buf(count * t.size + 1);
  for (size_t i = 0; i < count; ++i)
    put(t, buf.data(), i, c.rank() == root ? ival(seed, root, i) : 99.0);
  int64_t s;
  DLTensor bt = make_dltensor(buf.data(), static_cast<int64_t>(count), t.dl, &s);
  c.broadcast(bt, root).wait();
  for (size_t i = 0; i < count; ++i)
    if (get(t, buf.data(), i) != ival(seed, root, i))
      return "broadcast root " + std::to_string(root) + " count " + std::to_string(count) +
             " rank " + std::to_string(c.rank()) + ": element " + std::to_string(i) + " differs";
  return "";
}

// Run fn on n forked ranks; each rank gets its endpoint. fn returns "" on success.
void run_ranks(int n, const std::function<std::string(Endpoint&, int)>& fn,
               const std::string& opts = "{}",
               std::chrono::seconds limit = std::chrono::seconds(300)) {
  const int port = free_port();
  auto codes = fork_ranks(
      n,
      [&](int r) {
        auto ep = make_endpoint("tcp", r, n, port, opts);
        std::string err = fn(*ep, r);
        if (!err.empty()) {
          fprintf(stderr, "rank %d: %s\n", r, err.c_str());
          return 1;
        }
        return 0;
      },
      limit);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

// Allreduce of `count` random real values (fval(seed, me, .)) with `op`, in
// place or not; returns this rank's result bytes.
std::vector<char> allreduce_random(Communicator& comm, const TypeInfo& t, size_t count,
                                   dopt_reduce_op op, bool inplace, uint64_t seed, int me) {
  std::vector<char> send(count * t.size), recv(count * t.size);
  for (size_t i = 0; i < count; ++i) put(t, send.data(), i, fval(seed, me, i));
  int64_t s1, s2;
  DLTensor st = make_dltensor(send.data(), static_cast<int64_t>(count), t.dl, &s1);
  DLTensor rt =
      make_dltensor(inplace ? send.data() : recv.data(), static_cast<int64_t>(count), t.dl, &s2);
  comm.allreduce(st, rt, op).wait();
  return inplace ? send : recv;
}

// The two transports: shared memory with 64 KiB segments (2 x ~30 KiB slots,
// so the larger counts take many double-buffered rounds), and TCP only.
const char* const kTransports[] = {"{shm_bytes: 65536}", "{shm: false}"};

// /dev/shm entries created by process `pid` (segment names start "distopt-<pid>-").
std::vector<std::string> shm_entries_of(pid_t pid) {
  std::vector<std::string> out;
  std::string prefix = "distopt-" + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "allreduce: every dtype x op, counts 0/1/7/not divisible/multi-chunk, 2-4 ranks, shm and tcp") {
  for (const char* opts : kTransports)
    for (int n : {2, 3, 4}) {
      CAPTURE(opts);
      CAPTURE(n);
      run_ranks(
          n,
          [](Endpoint& ep, int) -> std::string {
            uint64_t seed = 1;
            for (const auto& t : kTypes)
              for (auto op : kOps)
                for (size_t count :
                     {size_t(0), size_t(1), size_t(7), size_t(1003), size_t(3 * 65536 + 5)}) {
                  std::string e = check_allreduce(*ep.comm, t, op, count, false, false, seed++);
                  if (!e.empty()) return e;
                }
            // In place, and real-valued random floats.
            for (const auto& t : {kTypes[0], kTypes[1], kTypes[2], kTypes[4]})
              for (auto op : kOps) {
                std::string e = check_allreduce(*ep.comm, t, op, 1003, true, false, seed++);
                if (!e.empty()) return e;
              }
            for (const auto& t : {kTypes[0], kTypes[1]})
              for (auto op : kOps)
                for (bool inplace : {false, true}) {
                  std::string e = check_allreduce(*ep.comm, t, op, 100003, inplace, true, seed++);
                  if (!e.empty()) return e;
                }
            return "";
          },
          opts);
    }
}

TEST_CASE("allreduce: every rank ends bitwise equal (random floats, one phase and two, in place)") {
  // Rounding depends on the order of the sum; every rank must use the same
  // one. One phase (<= 16 KiB, from 3 ranks) and two, over shared memory and tcp.
  for (const char* opts : kTransports)
    for (int n : {2, 3, 4}) {
      CAPTURE(opts);
      CAPTURE(n);
      run_ranks(
          n,
          [](Endpoint& ep, int me) -> std::string {
            uint64_t seed = 77;
            for (const auto& t : {kTypes[0], kTypes[2], kTypes[3]})
              for (size_t count : {size_t(5), size_t(1003), size_t(100003)})
                for (bool inplace : {false, true}) {
                  const std::vector<char> mine =
                      allreduce_random(*ep.comm, t, count, DOPT_REDUCE_AVG, inplace, seed++, me);
                  // Rank 0's result to everyone, compared byte for byte.
                  std::vector<char> r0(mine);
                  int64_t s3;
                  DLTensor bt = make_dltensor(r0.data(), static_cast<int64_t>(count), t.dl, &s3);
                  ep.comm->broadcast(bt, 0).wait();
                  if (r0 != mine)
                    return std::string("allreduce ") + t.name + " count=" + std::to_string(count) +
                           (inplace ? " in place" : "") + ": rank " + std::to_string(me) +
                           " differs from rank 0";
                }
            return "";
          },
          opts);
    }
}

TEST_CASE("allreduce: 64 MiB float32 sum on 2 and 4 ranks, shm (default segment) and tcp") {
  for (const char* opts : {"{}", "{shm: false}"})
    for (int n : {2, 4}) {
      CAPTURE(opts);
      CAPTURE(n);
      run_ranks(
          n,
          [](Endpoint& ep, int) {
            return check_allreduce(*ep.comm, kTypes[0], DOPT_REDUCE_SUM, 16u << 20, false, false,
                                   77);
          },
          opts);
    }
}

TEST_CASE("reduce_scatter, allgather, broadcast, barrier on 2-4 ranks, shm and tcp") {
  for (const char* opts : kTransports)
    for (int n : {2, 3, 4}) {
      CAPTURE(opts);
      CAPTURE(n);
      run_ranks(
          n,
          [n](Endpoint& ep, int me) -> std::string {
            uint64_t seed = 100;
            for (const auto& t : kTypes)
              for (auto op : kOps)
                for (size_t block :
                     {size_t(0), size_t(1), size_t(7), size_t(1003), size_t(70001)}) {
                  std::string e = check_reduce_scatter(*ep.comm, t, op, block, seed++);
                  if (!e.empty()) return e;
                }
            for (const auto& t : kTypes)
              for (size_t block : {size_t(0), size_t(1), size_t(7), size_t(1003), size_t(70001)}) {
                std::string e = check_allgather(*ep.comm, t, block, seed++);
                if (!e.empty()) return e;
              }
            for (int root = 0; root < n; ++root)
              for (size_t count :
                   {size_t(0), size_t(1), size_t(7), size_t(1003), size_t(1 << 20)}) {
                std::string e = check_broadcast(*ep.comm, root, count, seed++);
                if (!e.empty()) return e;
              }
            // Barrier: after it, every rank's arrival is visible in the store.
            for (int round = 1; round <= 3; ++round) {
              ep.store->add("arrived", 1);
              ep.comm->barrier().wait();
              int64_t seen = ep.store->add("arrived", 0);
              if (seen < round * n)
                return "barrier round " + std::to_string(round) + " on rank " + std::to_string(me) +
                       ": only " + std::to_string(seen) + " arrivals visible";
              ep.comm->barrier().wait();  // keep rounds apart
            }
            return "";
          },
          opts);
    }
}

TEST_CASE(
    "asynchronous requests: several collectives in flight complete in issue order, shm and tcp") {
  for (const char* opts : kTransports) {
    CAPTURE(opts);
    run_ranks(
        3,
        [](Endpoint& ep, int me) -> std::string {
          std::vector<std::vector<float>> bufs(8, std::vector<float>(50000));
          std::vector<int64_t> shapes(8);
          std::vector<CommRequest> reqs;
          for (int k = 0; k < 8; ++k) {
            for (auto& x : bufs[k]) x = static_cast<float>(me + k);
            DLTensor t = make_dltensor(bufs[k].data(), 50000, dl_f32(), &shapes[k]);
            reqs.push_back(ep.comm->allreduce(t, t, DOPT_REDUCE_SUM));
          }
          for (int k = 7; k >= 0; --k) reqs[k].wait();  // waiting out of order is fine
          for (int k = 0; k < 8; ++k)
            if (bufs[k][49999] != static_cast<float>(3 * k + 3))
              return "request " + std::to_string(k) + " has a wrong sum";
          bool done = reqs[0].test();
          if (!done) return "test() on a completed request returned false";
          // Mixed collectives back to back: the shared round counter stays in step.
          std::vector<float> g(3 * 7001), b(7001, me == 1 ? 5.0f : 0.0f);
          int64_t sg, sb, sm;
          DLTensor tg = make_dltensor(g.data(), 3 * 7001, dl_f32(), &sg),
                   tb = make_dltensor(b.data(), 7001, dl_f32(), &sb);
          DLTensor tm = make_dltensor(bufs[0].data(), 7001, dl_f32(), &sm);
          auto q1 = ep.comm->broadcast(tb, 1);
          auto q2 = ep.comm->allgather(tm, tg);
          auto q3 = ep.comm->reduce_scatter(tg, tb, DOPT_REDUCE_MAX);
          q1.wait(), q2.wait(), q3.wait();
          if (b[7000] != 3.0f)
            return "mixed collectives: reduce_scatter after allgather gave " +
                   std::to_string(b[7000]);
          return "";
        },
        opts);
  }
}

TEST_CASE(
    "send/recv: tags match in order, out-of-order posting, zero bytes, size mismatch is an error") {
  run_ranks(3, [](Endpoint& ep, int me) -> std::string {
    const int n = 3, next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<int32_t> a(1000, me * 10 + 1), b(200000, me * 10 + 2), c(5, me * 10 + 3);
    std::vector<int32_t> ra(1000), rb(200000), rc(5);
    int64_t sa, sb, sc, sra, srb, src, sz, srz;
    DLDataType i32{kDLInt, 32, 1};
    DLTensor ta = make_dltensor(a.data(), 1000, i32, &sa),
             tb = make_dltensor(b.data(), 200000, i32, &sb),
             tc = make_dltensor(c.data(), 5, i32, &sc);
    DLTensor tra = make_dltensor(ra.data(), 1000, i32, &sra),
             trb = make_dltensor(rb.data(), 200000, i32, &srb),
             trc = make_dltensor(rc.data(), 5, i32, &src);
    DLTensor tz = make_dltensor(nullptr, 0, i32, &sz), trz = make_dltensor(nullptr, 0, i32, &srz);
    // Sent in order tag 7, 3, 3, 0(empty); received posting tag 3 first.
    auto s1 = ep.comm->send(ta, next, 7);
    auto s2 = ep.comm->send(tb, next, 3);
    auto s3 = ep.comm->send(tc, next, 3);
    auto s4 = ep.comm->send(tz, next, 0);
    auto r2 = ep.comm->recv(trb, prev, 3);
    auto r3 = ep.comm->recv(trc, prev, 3);
    auto r4 = ep.comm->recv(trz, prev, 0);
    auto r1 = ep.comm->recv(tra, prev, 7);
    for (auto* r : {&s1, &s2, &s3, &s4, &r1, &r2, &r3, &r4}) r->wait();
    if (ra[999] != prev * 10 + 1 || rb[199999] != prev * 10 + 2 || rc[4] != prev * 10 + 3)
      return "payloads arrived at the wrong receives";
    // A receive whose buffer has the wrong size fails with a message saying so.
    auto s5 = ep.comm->send(ta, next, 9);
    auto r5 = ep.comm->recv(trc, prev, 9);
    s5.wait();
    try {
      r5.wait();
      return "size mismatch was not reported";
    } catch (const CommError& e) {
      if (!std::strstr(e.what(), "bytes")) return std::string("unexpected message: ") + e.what();
    }
    // The communicator is still usable afterwards.
    ep.comm->barrier().wait();
    return "";
  });
}

TEST_CASE(
    "split: colors, key ordering, color < 0, collectives in the sub-communicator, shm and tcp") {
  for (const char* opts : kTransports) {
    CAPTURE(opts);
    run_ranks(
        4,
        [](Endpoint& ep, int me) -> std::string {
          // Color by parity; key reverses the order inside each group; rank 3 opts out.
          int color = me == 3 ? -1 : me % 2;
          auto sub = ep.comm->split(color, -me);
          int64_t s;
          if (me == 3) {
            if (sub) return "color -1 gave a communicator";
          } else {
            if (!sub) return "split returned no communicator";
            int expect_size = me % 2 == 0 ? 2 : 1;  // {0,2} and {1}
            int expect_rank = me == 0 ? 1 : 0;      // key -me: rank 2 comes first
            if (sub->world_size() != expect_size || sub->rank() != expect_rank)
              return "sub-communicator rank/size " + std::to_string(sub->rank()) + "/" +
                     std::to_string(sub->world_size());
            float v = static_cast<float>(me);
            DLTensor t = make_dltensor(&v, 1, dl_f32(), &s);
            sub->allreduce(t, t, DOPT_REDUCE_SUM).wait();
            float want = me % 2 == 0 ? 2.0f : 1.0f;
            if (v != want) return "allreduce in the sub-communicator gave " + std::to_string(v);
          }
          // The parent still works after the split, with every rank (the one that opted out too).
          float w = 1;
          DLTensor tw = make_dltensor(&w, 1, dl_f32(), &s);
          ep.comm->allreduce(tw, tw, DOPT_REDUCE_SUM).wait();
          return w == 4.0f ? "" : "parent allreduce after split gave " + std::to_string(w);
        },
        opts);
  }
}

TEST_CASE(
    "shm: ranks with different shm options agree on one transport; no /dev/shm entry outlives "
    "create") {
  const int n = 3, port = free_port();
  auto codes = fork_ranks(n, [&](int me) {
    // Rank 1 turns shared memory off: the others must fall back to TCP too.
    auto ep = make_endpoint("tcp", me, n, port, me == 1 ? "{shm: false}" : "{}");
    if (!shm_entries_of(getpid()).empty()) return 10;
    std::vector<float> v(100003, static_cast<float>(me + 1));
    int64_t s;
    DLTensor t = make_dltensor(v.data(), static_cast<int64_t>(v.size()), dl_f32(), &s);
    ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
    return v[0] == 6.0f && v[100002] == 6.0f ? 0 : 1;
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

TEST_CASE("shm_stores: plain, streaming and mixed ranks give the same bits in every collective") {
  // Streaming stores change how a rank writes into its segment, never what:
  // the results of one set of inputs must be bitwise equal whichever way
  // each rank stores (the reduced slice goes through an L1 stage when
  // streaming). 1 MiB segments: the large tensors take several rounds.
  const int n = 3;
  const char* const kModes[][n] = {{"plain", "plain", "plain"},
                                   {"streaming", "streaming", "streaming"},
                                   {"streaming", "plain", "auto"}};
  const size_t kCombos = sizeof kModes / sizeof kModes[0];
  // One FNV-1a hash per combo and rank, written by the ranks (forked).
  auto* hashes =
      static_cast<uint64_t*>(mmap(nullptr, sizeof(uint64_t) * kCombos * n, PROT_READ | PROT_WRITE,
                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(hashes != MAP_FAILED);
  for (size_t c = 0; c < kCombos; ++c) {
    CAPTURE(c);
    const int port = free_port();
    auto codes = fork_ranks(n, [&](int me) {
      auto ep =
          make_endpoint("tcp", me, n, port, std::string("{shm_stores: ") + kModes[c][me] + "}");
      uint64_t h = 1469598103934665603ull;
      auto mix = [&](const std::vector<char>& v) {
        for (char b : v) h = (h ^ static_cast<unsigned char>(b)) * 1099511628211ull;
      };
      uint64_t seed = 5;
      for (const auto& t : {kTypes[0], kTypes[2], kTypes[1]})
        for (size_t count : {size_t(100003), size_t(3 * 65536 + 5), size_t(600000)})
          for (auto op : {DOPT_REDUCE_SUM, DOPT_REDUCE_AVG})
            for (bool inplace : {false, true})
              mix(allreduce_random(*ep->comm, t, count, op, inplace, seed++, me));
      // reduce_scatter, allgather and broadcast write only the copy in.
      const size_t block = 200001;
      std::vector<char> rs_send(block * 4 * n), rs_recv(block * 4), ag_recv(block * 4 * n);
      for (size_t i = 0; i < block * n; ++i) put(kTypes[0], rs_send.data(), i, fval(99, me, i));
      int64_t s1, s2, s3;
      DLTensor a =
          make_dltensor(rs_send.data(), static_cast<int64_t>(block * n), kTypes[0].dl, &s1);
      DLTensor b = make_dltensor(rs_recv.data(), static_cast<int64_t>(block), kTypes[0].dl, &s2);
      DLTensor g =
          make_dltensor(ag_recv.data(), static_cast<int64_t>(block * n), kTypes[0].dl, &s3);
      ep->comm->reduce_scatter(a, b, DOPT_REDUCE_SUM).wait();
      mix(rs_recv);
      ep->comm->allgather(b, g).wait();
      mix(ag_recv);
      ep->comm->broadcast(a, 1).wait();
      mix(rs_send);
      hashes[c * n + me] = h;
      return 0;
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(codes[r] == 0);
    }
  }
  // The same on every rank (allreduce, allgather, broadcast agree; the
  // reduce_scatter blocks differ, so compare combos rank by rank).
  for (int r = 0; r < n; ++r)
    for (size_t c = 1; c < kCombos; ++c) {
      CAPTURE(r);
      CAPTURE(c);
      CHECK(hashes[c * n + r] == hashes[r]);
    }
  munmap(hashes, sizeof(uint64_t) * kCombos * n);
}

TEST_CASE("shm_stores: a value other than auto, plain or streaming is refused, naming it") {
  const int port = free_port();
  auto codes = fork_ranks(1, [&](int) {
    try {
      auto ep = make_endpoint("tcp", 0, 1, port, "{shm_stores: fast}");
    } catch (const std::exception& e) {
      const std::string w = e.what();
      return w.find("shm_stores") != std::string::npos && w.find("fast") != std::string::npos ? 0
                                                                                              : 2;
    }
    return 1;
  });
  CHECK(codes[0] == 0);
}

TEST_CASE("split: a rank that never calls it is named once timeout_s has passed") {
  const int n = 3, port = free_port();
  auto codes = fork_ranks(n, [&](int me) {
    auto ep = make_endpoint("tcp", me, n, port, "{timeout_s: 1}");
    int rc = 0;
    if (me != 1) {  // rank 1 skips the split (and leaves)
      try {
        ep->comm->split(0, me);
        rc = 1;
      } catch (const ComponentError& e) {
        const std::string m = e.what();
        // TIMEOUT, or COMM when the store's host (rank 0) left first: both name rank 1.
        if (e.status() != DOPT_ERR_TIMEOUT && e.status() != DOPT_ERR_COMM) rc = 2;
        if (m.find("split: rank 1 did not publish its color") == std::string::npos) rc = 3;
      }
    }
    return rc;
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

TEST_CASE("world size 1: every collective works without peers") {
  auto codes = fork_ranks(1, [](int) {
    auto ep = make_endpoint("tcp", 0, 1, free_port());
    for (const auto& t : kTypes)
      for (auto op : kOps)
        if (!check_allreduce(*ep->comm, t, op, 7, false, false, 5).empty()) return 1;
    if (!check_reduce_scatter(*ep->comm, kTypes[0], DOPT_REDUCE_AVG, 7, 5).empty()) return 2;
    if (!check_allgather(*ep->comm, kTypes[0], 7, 5).empty()) return 3;
    if (!check_broadcast(*ep->comm, 0, 7, 5).empty()) return 4;
    ep->comm->barrier().wait();
    auto sub = ep->comm->split(0, 0);
    return sub && sub->world_size() == 1 ? 0 : 5;
  });
  CHECK(codes[0] == 0);
}

TEST_CASE("bad arguments return errors without crashing; the communicator stays usable") {
  run_ranks(2, [](Endpoint& ep, int) -> std::string {
    std::vector<float> a(10), b(9);
    int64_t sa, sb;
    DLTensor ta = make_dltensor(a.data(), 10, dl_f32(), &sa),
             tb = make_dltensor(b.data(), 9, dl_f32(), &sb);
    auto expect = [](dopt_status want, const std::function<void()>& f,
                     const char* what) -> std::string {
      try {
        f();
      } catch (const ComponentError& e) {
        if (e.status() == want) return "";
        return std::string(what) + ": status " + dopt_status_string(e.status()) + ": " + e.what();
      }
      return std::string(what) + ": no error";
    };
    std::string e;
    e += expect(
        DOPT_ERR_INVALID_ARGUMENT, [&] { ep.comm->allreduce(ta, tb, DOPT_REDUCE_SUM); },
        "count mismatch");
    e += expect(
        DOPT_ERR_INVALID_ARGUMENT,
        [&] { ep.comm->allreduce(ta, ta, static_cast<dopt_reduce_op>(42)); }, "bad op");
    e += expect(
        DOPT_ERR_INVALID_ARGUMENT, [&] { ep.comm->broadcast(ta, 5); }, "bad root");
    e += expect(
        DOPT_ERR_INVALID_ARGUMENT, [&] { ep.comm->send(ta, 7, 0); }, "bad peer");
    e += expect(
        DOPT_ERR_INVALID_ARGUMENT, [&] { ep.comm->reduce_scatter(ta, ta, DOPT_REDUCE_SUM); },
        "rs sizes");
    std::vector<uint8_t> u(10);
    int64_t su;
    DLTensor tu = make_dltensor(u.data(), 10, DLDataType{kDLUInt, 8, 1}, &su);
    e += expect(
        DOPT_ERR_UNSUPPORTED, [&] { ep.comm->allreduce(tu, tu, DOPT_REDUCE_SUM); }, "uint8 reduce");
    DLTensor gpu = ta;
    gpu.device = DLDevice{kDLCUDA, 0};
    e += expect(
        DOPT_ERR_UNSUPPORTED, [&] { ep.comm->allreduce(gpu, gpu, DOPT_REDUCE_SUM); },
        "device memory");
    if (!e.empty()) return e;
    std::fill(a.begin(), a.end(), 1.0f);
    ep.comm->allreduce(ta, ta, DOPT_REDUCE_SUM).wait();
    return a[9] == 2.0f ? "" : "allreduce after bad calls is wrong";
  });
}

TEST_CASE("send/recv: a receive posted while its message is streaming in still gets it") {
  // A message with no receive posted streams into a holding buffer; a
  // receive posted before its last byte arrived must take it (it was once
  // left waiting: the decentralized ring hung). Delays sweep the window.
  run_ranks(
      2,
      [](Endpoint& ep, int me) -> std::string {
        constexpr int64_t kCount = 4 << 20;  // 16 MiB of float32
        std::vector<float> buf(kCount);
        int64_t s;
        DLTensor t = make_dltensor(buf.data(), kCount, dl_f32(), &s);
        for (int i = 0; i < 24; ++i) {
          if (me == 0) {
            for (int64_t k = 0; k < kCount; ++k) buf[k] = static_cast<float>(i * 7 + k % 13);
            ep.comm->send(t, 1, i % 3).wait();
          } else {
            std::this_thread::sleep_for(std::chrono::microseconds(700 * i));
            ep.comm->recv(t, 0, i % 3).wait();
            for (int64_t k = 0; k < kCount; k += 4099)
              if (buf[k] != static_cast<float>(i * 7 + k % 13))
                return "message " + std::to_string(i) + " corrupt at " + std::to_string(k);
          }
        }
        ep.comm->barrier().wait();
        return "";
      },
      "{timeout_s: 10.0}");
}

TEST_CASE(
    "timeouts: an unmatched recv and a collective a peer never joins fail with TIMEOUT naming the "
    "peer") {
  run_ranks(
      2,
      [](Endpoint& ep, int me) -> std::string {
        if (me == 0) {
          float x = 0;
          int64_t s;
          DLTensor t = make_dltensor(&x, 1, dl_f32(), &s);
          try {
            ep.comm->recv(t, 1, 99).wait();
            return "recv without a sender completed";
          } catch (const CommError& e) {
            // Rank 1 is alive (its keep-alive pings arrive), only not sending.
            if (e.status() != DOPT_ERR_TIMEOUT || !std::strstr(e.what(), "rank 1") ||
                std::strstr(e.what(), "silent"))
              return std::string("recv timeout: ") + e.what();
          }
          try {
            ep.comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
            return "allreduce without the peer completed";
          } catch (const CommError& e) {
            if (e.status() != DOPT_ERR_TIMEOUT || !std::strstr(e.what(), "allreduce") ||
                !std::strstr(e.what(), "rank 1") || std::strstr(e.what(), "silent"))
              return std::string("allreduce timeout: ") + e.what();
          }
          ep.store->set("rank0-done", std::string("1"));
          // Rank 0 hosts the store: keep it up until rank 1 is through with it.
          ep.store->get("rank1-done", std::chrono::seconds(60));
        } else {
          ep.store->get("rank0-done", std::chrono::seconds(60));
          // Rank 0 told us it gave up: our next operation fails at once, naming why.
          try {
            ep.comm->barrier().wait();
            return "barrier after the peer aborted completed";
          } catch (const CommError& e) {
            if (!std::strstr(e.what(), "rank 0")) return std::string("abort notice: ") + e.what();
          }
          ep.store->set("rank1-done", std::string("1"));
        }
        return "";
      },
      "{timeout_s: 1.0}");
}

TEST_CASE(
    "a stopped peer (no EOF, no RST: as behind a cut link) is named silent in every rank's "
    "timeout, shm and tcp") {
  // Rank 2 stops itself (SIGSTOP) before the second allreduce; a child it
  // forked resumes it after the others timed out. Rank 0 waits on rank 1 in
  // the ring (or on shared memory), yet both name rank 2, whose keep-alive
  // pings stopped.
  for (const char* opts : {"{timeout_s: 2.0}", "{timeout_s: 2.0, shm: false}"}) {
    CAPTURE(opts);
    run_ranks(
        3,
        [](Endpoint& ep, int me) -> std::string {
          float x = 1;
          int64_t s;
          DLTensor t = make_dltensor(&x, 1, dl_f32(), &s);
          ep.comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();  // everyone is connected
          if (me == 2) {
            stop_self_for(6);
            try {
              ep.comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();  // the others gave up
            } catch (const CommError&) {
            }
            return "";
          }
          try {
            ep.comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
            return "allreduce with a stopped peer completed";
          } catch (const CommError& e) {
            if (!std::strstr(e.what(), "rank 2 silent for"))
              return std::string("message: ") + e.what();
          }
          return "";
        },
        opts, std::chrono::seconds(60));
  }
}

TEST_CASE(
    "a rank that dies mid-allreduce makes every other rank's wait fail, naming it (shm and tcp); "
    "no /dev/shm leak") {
  // Rank 2 dies (DISTOPT_FAULT_INJECT, plugins/tcp/fault.hpp) once it has
  // handed peers 1 MiB of the 32 MiB of its second collective: on every
  // machine, however fast, the allreduce is in progress then. Small shm
  // segments make the shm allreduce many rounds long.
  for (const char* opts : {"{timeout_s: 600, shm_bytes: 65536}", "{timeout_s: 600, shm: false}"}) {
    CAPTURE(opts);
    const int n = 4, dead = 2;
    const int port = free_port();
    // The ranks' pids, to look for their segments after they are gone.
    auto* pids = static_cast<pid_t*>(mmap(nullptr, sizeof(pid_t) * n, PROT_READ | PROT_WRITE,
                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    REQUIRE(pids != MAP_FAILED);
    setenv("DISTOPT_FAULT_INJECT", ("comm_exit:" + std::to_string(dead) + ":2:1048576").c_str(), 1);
    auto codes = fork_ranks(
        n,
        [&](int me) {
          pids[me] = getpid();
          // A long timeout: only failure detection, not the timeout, can end this in time.
          auto ep = make_endpoint("tcp", me, n, port, opts);
          std::vector<float> buf(8u << 20, 1.0f);
          int64_t s;
          DLTensor t = make_dltensor(buf.data(), static_cast<int64_t>(buf.size()), dl_f32(), &s);
          ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();  // everyone is connected and working
          return check_dead_peer_named(*ep->comm, t, me, dead);
        },
        std::chrono::seconds(60));
    unsetenv("DISTOPT_FAULT_INJECT");
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(codes[r] == 0);
      CHECK(shm_entries_of(pids[r]).empty());
    }
    munmap(pids, sizeof(pid_t) * n);
  }
}

namespace {
// Connect to host:port and send `bytes`; true if the peer then closed the
// connection without accepting (no 'K' byte).
bool refused(const std::string& addr, const std::string& bytes) {
  auto colon = addr.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  inet_pton(AF_INET, addr.substr(0, colon).c_str(), &a.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return false;
  }
  (void)!write(fd, bytes.data(), bytes.size());
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c = 0;
  ssize_t k = read(fd, &c, 1);
  close(fd);
  return k <= 0 || c != 'K';
}
}  // namespace

TEST_CASE(
    "a peer that closes the communicator fails a collective waiting on it at once, shm and tcp") {
  // timeout_s 60: without noticing the goodbye, the wait would last a minute.
  for (const char* opts : {"{timeout_s: 60}", "{timeout_s: 60, shm: false}"}) {
    CAPTURE(opts);
    run_ranks(
        2,
        [](Endpoint& ep, int me) -> std::string {
          if (me == 1) {
            ep.store->get("issued", std::chrono::seconds(60));
            ep.comm.reset();  // destroy: goodbye to rank 0 (no crash)
            ep.store->set("left", std::string("1"));
            return "";
          }
          float x = 1;
          int64_t s;
          DLTensor t = make_dltensor(&x, 1, dl_f32(), &s);
          auto req = ep.comm->allreduce(t, t, DOPT_REDUCE_SUM);
          ep.store->set("issued", std::string("1"));
          const auto t0 = std::chrono::steady_clock::now();
          try {
            req.wait();
            return "allreduce with a peer that left completed";
          } catch (const CommError& e) {
            if (!std::strstr(e.what(), "rank 1 closed the communicator"))
              return std::string("message: ") + e.what();
          }
          if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30))
            return "noticed only at the timeout";
          ep.store->get("left", std::chrono::seconds(60));  // rank 1 done with the store
          return "";
        },
        opts);
  }
}

TEST_CASE("communicator listeners refuse connections without the job token") {
  const int port = free_port();
  auto codes = fork_ranks(3, [&](int me) {
    if (me == 2) {
      // An intruder: it knows the store token (to read the address) but
      // presents a wrong communicator token, then garbage.
      StoreOptions so;
      so.url = "tcp://127.0.0.1:" + std::to_string(port);
      so.rank = 1;
      so.world_size = 2;
      so.token = "test-token";
      auto store = make_store(so);
      std::string addr = store->get_string("test/tcp/addr/0");
      std::string hello("DOPTTCP1", 8);
      uint32_t len = 5;
      hello.append(reinterpret_cast<const char*>(&len), 4);
      hello += "wrong";
      bool ok = refused(addr, hello) && refused(addr, std::string(64, 'x'));
      store->set("intruder-done", std::string(ok ? "1" : "0"));
      return ok ? 0 : 1;
    }
    if (me == 1) {
      // Join only after the intruder was turned away.
      StoreOptions so;
      so.url = "tcp://127.0.0.1:" + std::to_string(port);
      so.rank = 1;
      so.world_size = 2;
      so.token = "test-token";
      make_store(so)->get("intruder-done", std::chrono::seconds(60));
    }
    auto ep = make_endpoint("tcp", me, 2, port);
    float v = 1;
    int64_t s;
    DLTensor t = make_dltensor(&v, 1, dl_f32(), &s);
    ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
    return v == 2.0f ? 0 : 2;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  CHECK(codes[2] == 0);
}
