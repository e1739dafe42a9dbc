// The rendezvous store (tcp://, env://, file://), Store::barrier, and the
// host API table that hands the store, options, errors and metrics to plugins.
#include "distopt/store.hpp"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"

using namespace distopt;
using namespace distopt::test;
using namespace std::chrono_literals;

namespace {

StoreOptions tcp_opts(int port, int rank, int world, const std::string& token = "tok") {
  StoreOptions o;
  o.url = "tcp://127.0.0.1:" + std::to_string(port);
  o.rank = rank;
  o.world_size = world;
  o.token = token;
  o.timeout = 30s;
  return o;
}

// Exercise set/get/add/check/barrier from `n` processes on one store URL.
void shared_store_roundtrip(const std::function<StoreOptions(int)>& opts, int n) {
  auto codes = fork_ranks(n, [&](int r) {
    auto s = make_store(opts(r));
    s->set("key/" + std::to_string(r), "value-" + std::to_string(r));
    for (int p = 0; p < n; ++p)
      if (s->get_string("key/" + std::to_string(p)) != "value-" + std::to_string(p)) return 1;
    for (int i = 0; i < 50; ++i) s->add("counter", 1);
    s->barrier("after-adds", n, 30s);
    if (s->add("counter", 0) != 50 * n) return 2;
    if (!s->check("key/0") || s->check("no-such-key")) return 3;
    s->set("key/" + std::to_string(r), std::string("replaced"));
    s->barrier("after-replace", n, 30s);
    if (s->get_string("key/" + std::to_string((r + 1) % n)) != "replaced") return 4;
    // Rank 0 hosts the tcp:// server: it stays up until every other rank is done with it.
    if (r != 0)
      s->set("left/" + std::to_string(r), std::string("1"));
    else
      for (int p = 1; p < n; ++p) s->get("left/" + std::to_string(p), 30s);
    return 0;
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
}

}  // namespace

TEST_CASE("tcp:// store: set/get/add/check/barrier across 3 processes") {
  int port = random_port();
  shared_store_roundtrip([&](int r) { return tcp_opts(port, r, 3); }, 3);
}

TEST_CASE("env:// store reads MASTER_ADDR and MASTER_PORT") {
  int port = random_port();
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  shared_store_roundtrip(
      [&](int r) {
        StoreOptions o = tcp_opts(port, r, 2);
        o.url = "env://";
        return o;
      },
      2);
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  StoreOptions o;
  o.url = "env://";
  CHECK_THROWS_AS(make_store(o), ConfigError);
}

TEST_CASE("file:// store: shared directory, atomic add across processes") {
  char tmpl[] = "/tmp/distopt-file-store-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  std::string dir = std::string(tmpl) + "/rdzv";
  shared_store_roundtrip(
      [&](int r) {
        StoreOptions o;
        o.url = "file://" + dir;
        o.rank = r;
        o.world_size = 4;
        o.timeout = 30s;
        return o;
      },
      4);
  std::string cmd = "rm -rf " + std::string(tmpl);
  CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("get times out with an error naming the key") {
  auto s = make_store(tcp_opts(random_port(), 0, 1));
  try {
    s->get("the-missing-key", 200ms);
    FAIL("get of a missing key returned");
  } catch (const RendezvousError& e) {
    CHECK(std::string(e.what()).find("the-missing-key") != std::string::npos);
  }
  // The connection is still usable after a timeout.
  s->set("present", std::string("yes"));
  CHECK(s->get_string("present") == "yes");
}

TEST_CASE("barrier times out naming how many ranks arrived") {
  auto s = make_store(tcp_opts(random_port(), 0, 1));
  try {
    s->barrier("lonely", 3, 200ms);
    FAIL("barrier with missing ranks returned");
  } catch (const RendezvousError& e) {
    CHECK(std::string(e.what()).find("1 of 3") != std::string::npos);
  }
}

TEST_CASE("the tcp store refuses clients without the job token") {
  int port = random_port();
  auto codes = fork_ranks(2, [&](int r) {
    if (r == 0) {
      auto s = make_store(tcp_opts(port, 0, 2, "right"));
      s->get("done", 60s);  // serve until the client side finished
      return 0;
    }
    // A wrong token is refused with a clear message.
    try {
      make_store(tcp_opts(port, 1, 2, "wrong"));
      return 1;
    } catch (const RendezvousError& e) {
      if (!std::strstr(e.what(), "token")) {
        fprintf(stderr, "message: %s\n", e.what());
        return 2;
      }
    }
    // A raw connection sending an oversized frame is dropped, not served.
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 3;
    uint8_t junk[8] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};
    (void)!write(fd, junk, sizeof junk);
    uint8_t buf[16];
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t k;
    size_t total = 0;
    while ((k = read(fd, buf, sizeof buf)) > 0) total += static_cast<size_t>(k);
    int err = errno;
    close(fd);
    if (k < 0 && (err == EAGAIN || err == EWOULDBLOCK))
      return 4;  // timed out: the server kept it open
    // The right token still works, and the server is still up.
    auto s = make_store(tcp_opts(port, 1, 2, "right"));
    s->set("done", std::string("1"));
    return 0;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("clients retry until the server is up, and give up after the timeout") {
  int port = random_port();
  auto codes = fork_ranks(2, [&](int r) {
    if (r == 0) {
      usleep(300 * 1000);  // the client starts first
      auto s = make_store(tcp_opts(port, 0, 2));
      s->get("client-was-here", 30s);
      return 0;
    }
    auto s = make_store(tcp_opts(port, 1, 2));
    s->set("client-was-here", std::string("1"));
    return 0;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  StoreOptions o = tcp_opts(random_port(), 1, 2);
  o.timeout = 300ms;
  CHECK_THROWS_AS(make_store(o), RendezvousError);
}

TEST_CASE("rank 0 finishing first keeps serving the store until the others disconnect") {
  // Rank 0 posts a last note and drops its store at once; rank 1 reads the
  // note only afterwards (as peers read a failed rank's collective post).
  int port = random_port();
  const std::string dir = make_temp_dir("linger");
  auto codes = fork_ranks(2, [&](int r) {
    auto s = make_store(tcp_opts(port, r, 2));
    s->barrier("up", 2, 30s);
    if (r == 0) {
      s->set("last-post", std::string("left 3"));
      s.reset();  // blocks while rank 1 is connected
      return 0;
    }
    s->get("last-post", 30s);
    usleep(500 * 1000);  // rank 0 is in its destructor by now
    if (s->get_string("last-post") != "left 3") return 1;
    return 0;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  // A rank that stays connected holds rank 0 for the bound, not forever.
  port = random_port();
  codes = fork_ranks(2, [&](int r) {
    auto s = make_store(tcp_opts(port, r, 2));
    s->barrier("up", 2, 30s);
    if (r == 1) {
      // Connected and silent until rank 0 has written how long it was held.
      for (int i = 0; i < 600 && access((dir + "/held_silent").c_str(), F_OK) != 0; ++i)
        usleep(100 * 1000);
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    s.reset();
    const double held =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream(dir + "/held_silent") << held;
    return 0;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  const double held_silent = std::stod(read_text(dir + "/held_silent"));
  CHECK(held_silent >= 4.5);  // the bound is 5 s
  CHECK(held_silent < 25);
  remove_tree(dir);
}

TEST_CASE("bad rendezvous URLs are configuration errors") {
  StoreOptions o;
  o.url = "udp://x:1";
  CHECK_THROWS_AS(make_store(o), ConfigError);
  o.url = "tcp://127.0.0.1";
  CHECK_THROWS_AS(make_store(o), RendezvousError);
  o.url = "tcp://127.0.0.1:1";
  o.rank = 2;
  o.world_size = 2;
  CHECK_THROWS_AS(make_store(o), ConfigError);
}

TEST_CASE("host API: store access, error sink, metrics, status checks") {
  const dopt_host_api* h = host_api();
  REQUIRE(h->struct_size >= DOPT_HOST_API_STRUCT_SIZE);
  CHECK(h->abi_major == DOPT_ABI_VERSION_MAJOR);

  auto s = make_store(tcp_opts(random_port(), 0, 1));
  auto* cs = reinterpret_cast<dopt_store*>(s.get());
  CHECK(h->store_set(cs, "k", "abc", 3) == DOPT_OK);
  char buf[8] = {};
  size_t len = 0;
  CHECK(h->store_get(cs, "k", buf, sizeof buf, &len, 1000) == DOPT_OK);
  CHECK(len == 3);
  CHECK(std::string(buf, len) == "abc");
  // A small buffer gets a prefix and the full length.
  CHECK(h->store_get(cs, "k", buf, 1, &len, 1000) == DOPT_OK);
  CHECK(len == 3);
  // An empty value (ucx's "admitted" barrier keys) reads back as length 0.
  CHECK(h->store_set(cs, "empty", "", 0) == DOPT_OK);
  CHECK(h->store_set(cs, "empty_null", nullptr, 0) == DOPT_OK);
  len = 7;
  CHECK(h->store_get(cs, "empty", buf, sizeof buf, &len, 1000) == DOPT_OK);
  CHECK(len == 0);
  len = 7;
  CHECK(h->store_get(cs, "empty_null", buf, sizeof buf, &len, 1000) == DOPT_OK);
  CHECK(len == 0);
  take_last_error();
  CHECK(h->store_get(cs, "absent", buf, sizeof buf, &len, 50) == DOPT_ERR_TIMEOUT);
  CHECK(take_last_error().find("absent") != std::string::npos);
  int64_t v = 0;
  CHECK(h->store_add(cs, "n", 5, &v) == DOPT_OK);
  CHECK(h->store_add(cs, "n", -2, &v) == DOPT_OK);
  CHECK(v == 3);
  CHECK(h->store_set(nullptr, "k", "a", 1) == DOPT_ERR_INVALID_ARGUMENT);

  h->set_error("detail from a plugin");
  CHECK(take_last_error() == "detail from a plugin");
  CHECK(take_last_error().empty());

  h->set_error("peer 3 vanished");
  try {
    check_status(DOPT_ERR_COMM, "tcp", "allreduce");
    FAIL("no throw");
  } catch (const CommError& e) {
    std::string m = e.what();
    CHECK(m.find("tcp") != std::string::npos);
    CHECK(m.find("allreduce") != std::string::npos);
    CHECK(m.find("peer 3 vanished") != std::string::npos);
    CHECK(e.status() == DOPT_ERR_COMM);
  }
  h->set_error("bad shape");
  CHECK_THROWS_AS(check_status(DOPT_ERR_INVALID_ARGUMENT, "mean", "reduce"), ComponentError);
  CHECK_NOTHROW(check_status(DOPT_OK, "x", "y"));
  CHECK_NOTHROW(check_status(DOPT_IN_PROGRESS, "x", "y"));

  metrics_reset();
  h->metric_add("comm.bytes_sent", 10);
  h->metric_add("comm.bytes_sent", 5);
  metric_add("comm.seconds", 0.5);
  auto m = metrics_snapshot();
  CHECK(m["comm.bytes_sent"] == 15);
  CHECK(m["comm.seconds"] == 0.5);
  metrics_reset();
  CHECK(metrics_snapshot().empty());
}
