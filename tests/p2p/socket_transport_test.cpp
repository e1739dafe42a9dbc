// tcp's SocketTransport (plugins/tcp/socket_transport.hpp) on real sockets
// (socketpairs, one thread per rank): tag matching in posting order when
// frames arrive before their receive is posted (held, then buffered), the
// errors it throws (size mismatch, closed peer, timeout, abort) naming the
// peer, and the SDK's collectives over it against a plain reference.
#include "socket_transport.hpp"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "distopt/sdk/collective/p2p_collectives.hpp"
#include "socket.hpp"

using distopt::plugins::tcp::SocketTransport;
using namespace distopt::sdk;
using namespace distopt::sdk::p2p;

namespace {

/// A full mesh of one-way non-blocking connections: out[r][p] writes what in[p][r] reads.
struct Mesh {
  explicit Mesh(int n)
      : out(n, std::vector<int>(n, -1)), in(n, std::vector<int>(n, -1)), abort(n), destroy(n) {
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p) {
        if (r == p) continue;
        int sv[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
        distopt::plugins::tcp::set_nonblocking(sv[0], true);
        distopt::plugins::tcp::set_nonblocking(sv[1], true);
        out[r][p] = sv[0];
        in[p][r] = sv[1];
      }
  }
  ~Mesh() {
    for (auto* m : {&out, &in})
      for (auto& v : *m)
        for (int fd : v)
          if (fd >= 0) close(fd);
  }
  SocketTransport transport(int r) {
    SocketTransport::Options o;
    o.max_io = 64 << 10;  // several calls per frame
    o.abort = &abort[r];
    o.destroy = &destroy[r];
    o.abort_grace = std::chrono::milliseconds(300);
    return SocketTransport(r, out[r], in[r], o);
  }
  std::vector<std::vector<int>> out, in;
  std::vector<std::atomic<bool>> abort, destroy;
};

Clock::time_point soon(int ms = 10000) { return Clock::now() + std::chrono::milliseconds(ms); }

/// fn(transport, rank) on one thread per rank; returns each rank's error ("" if none).
std::vector<std::string> run(Mesh& m, int n, const std::function<void(SocketTransport&, int)>& fn) {
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      SocketTransport t = m.transport(r);
      try {
        fn(t, r);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

}  // namespace

TEST_CASE("frames match receives by tag in posting order, also when they arrive first") {
  Mesh m(2);
  std::vector<char> a1(100, 'a'), big(1 << 20), a2(200, 'c');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  std::vector<char> r1(100), rbig(1 << 20), r2(200);
  auto err = run(m, 2, [&](SocketTransport& t, int r) {
    if (r == 0) {
      Handle hs[] = {t.isend(1, 5, a1.data(), a1.size()), t.isend(1, 9, big.data(), big.size()),
                     t.isend(1, 5, a2.data(), a2.size())};
      t.wait_all(hs, 3, soon());
      return;
    }
    // The big frame (tag 9) is posted first: the tag-5 frame ahead of it
    // in the stream is held, then buffered, and taken by the later receive.
    Handle h9 = t.irecv(0, 9, rbig.data(), rbig.size());
    t.wait_all(&h9, 1, soon());
    Handle hs[] = {t.irecv(0, 5, r1.data(), r1.size()), t.irecv(0, 5, r2.data(), r2.size())};
    t.wait_all(hs, 2, soon());
  });
  CHECK(err[0] == "");
  CHECK(err[1] == "");
  CHECK(r1 == a1);
  CHECK(r2 == a2);
  CHECK(rbig == big);
}

TEST_CASE("a size mismatch fails the receive with INTERNAL") {
  Mesh m(2);
  dopt_status st = DOPT_OK;
  auto err = run(m, 2, [&](SocketTransport& t, int r) {
    char buf[8] = {};
    if (r == 0) {
      Handle h = t.isend(1, 1, buf, 8);
      t.wait_all(&h, 1, soon());
      return;
    }
    Handle h = t.irecv(0, 1, buf, 4);
    try {
      t.wait_all(&h, 1, soon());
    } catch (const Error& e) {
      st = e.status();
      throw;
    }
  });
  CHECK(st == DOPT_ERR_INTERNAL);
  CHECK(err[1].find("rank 0") != std::string::npos);
}

TEST_CASE("a closed connection fails the receive with COMM naming the peer") {
  Mesh m(2);
  shutdown(m.out[0][1], SHUT_WR);  // rank 0's stream to rank 1 ends
  SocketTransport t = m.transport(1);
  char buf[4];
  Handle h = t.irecv(0, 1, buf, 4);
  try {
    t.wait_all(&h, 1, soon());
    FAIL("completed");
  } catch (const Error& e) {
    CHECK(e.status() == DOPT_ERR_COMM);
    CHECK(std::string(e.what()) == "connection to rank 0 lost (peer closed)");
  }
  CHECK(t.failed_peer() == 0);
  // Later operations with that peer fail at once.
  Handle h2 = t.isend(0, 2, buf, 4);
  CHECK_THROWS_AS(t.wait_all(&h2, 1, soon()), Error);
}

TEST_CASE("a receive nobody sends times out naming the peer") {
  Mesh m(3);
  SocketTransport t = m.transport(0);
  char buf[4];
  Handle h = t.irecv(2, 1, buf, 4);
  try {
    t.wait_all(&h, 1, soon(100));
    FAIL("completed");
  } catch (const Error& e) {
    CHECK(e.status() == DOPT_ERR_TIMEOUT);
    CHECK(std::string(e.what()) == "timed out waiting for rank 2");
  }
}

TEST_CASE("after the abort flag, data already sent still arrives during the grace; then ABORTED") {
  Mesh m(2);
  SocketTransport t0 = m.transport(0), t1 = m.transport(1);
  char out[4] = {1, 2, 3, 4}, in[4] = {};
  Handle s = t0.isend(1, 3, out, 4);  // small: on the wire at once
  t0.wait_all(&s, 1, soon());
  m.abort[1] = true;  // e.g. a third rank died
  Handle r = t1.irecv(0, 3, in, 4);
  t1.wait_all(&r, 1, soon());
  CHECK(std::memcmp(in, out, 4) == 0);
  // Never sent: ABORTED once the grace is over (TIMEOUT would mean the deadline).
  Handle r2 = t1.irecv(0, 4, in, 4);
  try {
    t1.wait_all(&r2, 1, soon());
    FAIL("completed");
  } catch (const Error& e) {
    CHECK(e.status() == DOPT_ERR_ABORTED);
  }
  // Destroy aborts at once, without a grace.
  m.destroy[0] = true;
  Handle r3 = t0.irecv(1, 5, in, 4);
  try {
    t0.wait_all(&r3, 1, soon());
    FAIL("completed");
  } catch (const Error& e) {
    CHECK(e.status() == DOPT_ERR_ABORTED);
    CHECK(std::string(e.what()) == "communicator destroyed");
  }
}

TEST_CASE("the SDK's collectives over SocketTransport match a reference, 2-4 ranks") {
  // Small segments and a shallow window: many frames arrive before their
  // receive is posted, the held / buffered paths run constantly.
  CollectiveOptions o;
  o.small_bytes = 1024;
  o.segment_bytes = 8192;
  o.recv_depth = 2;
  for (int n = 2; n <= 4; ++n)
    for (size_t count : {size_t(7), size_t(100003)}) {
      CAPTURE(n);
      CAPTURE(count);
      Mesh m(n);
      std::vector<int> bad(n, 0);
      auto err = run(m, n, [&](SocketTransport& t, int r) {
        Collectives c(t, o);
        std::vector<float> in(count), out(count), rs(count / n + 1), ag(n * 3);
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i * 7 + r) % 13);
        for (int rep = 0; rep < 3; ++rep) {  // back to back: a rank may run ahead
          c.allreduce(in.data(), out.data(), count, DType::F32, DOPT_REDUCE_SUM, soon());
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int q = 0; q < n; ++q) want += static_cast<float>((i * 7 + q) % 13);
            if (out[i] != want) ++bad[r];
          }
        }
        const size_t k = count / n;
        c.reduce_scatter(in.data(), rs.data(), k, DType::F32, DOPT_REDUCE_MAX, soon());
        for (size_t i = 0; i < k; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q)
            want = std::max(want, static_cast<float>(((r * k + i) * 7 + q) % 13));
          if (rs[i] != want) ++bad[r];
        }
        float mine[3] = {float(r), float(r + 10), float(r + 20)};
        c.allgather(mine, ag.data(), sizeof mine, soon());
        for (int q = 0; q < n; ++q)
          if (ag[q * 3] != q || ag[q * 3 + 2] != q + 20) ++bad[r];
        std::vector<float> b(count, r == 1 ? 3.5f : 0.f);
        c.broadcast(b.data(), b.size() * sizeof(float), 1, soon());
        for (float v : b)
          if (v != 3.5f) ++bad[r];
        c.barrier(soon());
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(err[r] == "");
        CHECK(bad[r] == 0);
      }
    }
}
