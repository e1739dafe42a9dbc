// The `nccl` communicator without a GPU. Every case runs in forked
// processes (the plugin loads NCCL once per process, from the environment
// the child sets): with the real libraries, create must be UNSUPPORTED with
// the reason; with the stand-in (standin/standin.cpp) the bootstrap through
// the store, the collectives at world size 1, the watchdog and both abort
// paths run for real. Tensors are kDLCUDA DLTensors over host memory (the
// stand-in reads them as host memory). Nothing here ran on a GPU.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "comm_helpers.hpp"
#include "distopt/error.hpp"
#include "result_files.hpp"

using namespace distopt;
using namespace distopt::test;

namespace {

const std::string kStandin = DISTOPT_NCCL_STANDIN;

/// In a child: load the stand-in instead of NCCL and the CUDA runtime.
void use_standin(const std::string& log = "") {
  setenv("DISTOPT_NCCL_LIBRARY", kStandin.c_str(), 1);
  setenv("DISTOPT_CUDART_LIBRARY", kStandin.c_str(), 1);
  if (!log.empty()) setenv("DISTOPT_STANDIN_LOG", log.c_str(), 1);
}

DLTensor cuda_tensor(std::vector<float>& v, int64_t* shape, int device_id = 0) {
  DLTensor t = make_dltensor(v.data(), static_cast<int64_t>(v.size()), dl_f32(), shape);
  t.device = DLDevice{kDLCUDA, device_id};
  return t;
}

/// The ComponentError of f: status and message ("" and 0 when none).
template <class F>
std::pair<dopt_status, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const ComponentError& e) {
    return {e.status(), e.what()};
  }
  return {DOPT_OK, ""};
}

bool has(const std::string& s, const std::string& needle) {
  if (s.find(needle) != std::string::npos) return true;
  std::fprintf(stderr, "missing '%s' in: %s\n", needle.c_str(), s.c_str());
  return false;
}

std::vector<std::string> lines_starting(const std::string& file, const std::string& prefix) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  return out;
}

std::string field(const std::string& line, const std::string& key) {
  const size_t p = line.find(key + "=");
  if (p == std::string::npos) return "";
  const size_t b = p + key.size() + 1;
  return line.substr(b, line.find(' ', b) - b);
}

int run_one(const std::function<int()>& f, int seconds = 120) {
  return fork_ranks(
      1, [&](int) { return f(); }, std::chrono::seconds(seconds))[0];
}

}  // namespace

TEST_CASE("`distopt plugins` lists nccl, accepting kDLCUDA memory only") {
  const std::string cli = env_path("DISTOPT_CLI");
  REQUIRE_MESSAGE(!cli.empty(), "DISTOPT_CLI is not set (run through ctest)");
  ProcResult r = run_command({cli, "plugins", "-P", plugin_dir(), "--json"});
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  const auto out = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  bool found = false;
  for (const auto& c : out.at("components")) {
    if (c.at("name") != "nccl" || c.at("kind") != "communicator") continue;
    found = true;
    CHECK(c.at("devices") == nlohmann::json::array({"kDLCUDA"}));
    CHECK(c.at("abi") == "1." + std::to_string(DOPT_ABI_VERSION_MINOR));
  }
  CHECK(found);
}

TEST_CASE("create with the real libraries on this host: UNSUPPORTED naming why (or a GPU)") {
  const int port = free_port();
  const int code = run_one([&] {
    unsetenv("DISTOPT_NCCL_LIBRARY");
    unsetenv("DISTOPT_CUDART_LIBRARY");
    std::unique_ptr<Endpoint> ep;
    auto [st, msg] = error_of([&] { ep = make_endpoint("nccl", 0, 1, port); });
    if (st == DOPT_OK) {
      std::fprintf(stderr, "a usable GPU and NCCL are present: the no-GPU path is not run\n");
      return 0;
    }
    std::fprintf(stderr, "create refused as expected: %s\n", msg.c_str());
    if (st != DOPT_ERR_UNSUPPORTED) return 2;
    if (!has(msg, "nccl: create failed (UNSUPPORTED)")) return 3;
    const bool named = msg.find("no usable CUDA device") != std::string::npos ||
                       msg.find("no CUDA device") != std::string::npos ||
                       msg.find("could not be loaded") != std::string::npos;
    return named ? 0 : 4;
  });
  CHECK(code == 0);
}

TEST_CASE("create: a missing library, or no device, is UNSUPPORTED on every rank, never a crash") {
  SUBCASE("DISTOPT_NCCL_LIBRARY names a missing file") {
    const int port = free_port();
    CHECK(run_one([&] {
            use_standin();
            setenv("DISTOPT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
            auto [st, msg] = error_of([&] { make_endpoint("nccl", 0, 1, port); });
            if (st != DOPT_ERR_UNSUPPORTED) return 2;
            return has(msg, "the NCCL library could not be loaded") &&
                           has(msg, "DISTOPT_NCCL_LIBRARY") && has(msg, "/nonexistent/libnccl.so.2")
                       ? 0
                       : 3;
          }) == 0);
  }
  SUBCASE("no CUDA device: rank 0's reason reaches rank 1 through the store") {
    const int port = free_port();
    auto codes = fork_ranks(
        2,
        [&](int me) {
          use_standin();
          // Rank 0 has no device, rank 1 has one: rank 1 would wait
          // timeout_s (600 s) for the id if rank 0 did not publish its
          // failure (the fork timeout below is much shorter).
          setenv("DISTOPT_STANDIN_DEVICES", me == 0 ? "0" : "1", 1);
          // Rank 0 hosts the store: it stays up until rank 1 has read the
          // reason (else rank 1 may find it gone: connection refused).
          std::shared_ptr<Store> store;
          auto [st, msg] = error_of(
              [&] { make_endpoint("nccl", me, 2, port, "{}", "test-token", "test", &store); });
          int code = 0;
          if (st != DOPT_ERR_UNSUPPORTED)
            code = 2;
          else if (!has(msg, "cudaErrorNoDevice"))
            code = 3;
          else if (me == 1 && !has(msg, "rank 0 could not create its endpoint"))
            code = 4;
          if (!store) return 5;
          if (me == 1)
            store->set("test/rank1_read", std::string("1"));
          else
            store->get("test/rank1_read", std::chrono::seconds(60));
          return code;
        },
        std::chrono::seconds(120));
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
  }
}

TEST_CASE("bootstrap: 3 processes get rank 0's ncclUniqueId through the store, init non-blocking") {
  TempDir dir("distopt-nccl-boot");
  const std::string log = dir.path + "/standin.log";
  const int port = free_port();
  auto codes = fork_ranks(
      3,
      [&](int me) {
        use_standin(log);
        auto ep = make_endpoint("nccl", me, 3, port);
        if (ep->comm->rank() != me || ep->comm->world_size() != 3) return 2;
        ep->comm.reset();  // graceful destroy: finalize + destroy
        // Rank 0 hosts the store: it leaves only after every other rank has
        // said (with an acknowledged set, its last store request) that it
        // needs the store no more. Under load rank 0 used to finish first
        // and take the store with it while rank 2 was still reading.
        if (me == 0) {
          for (int r = 1; r < 3; ++r)
            ep->store->get("left/" + std::to_string(r), std::chrono::seconds(60));
        } else {
          ep->store->set("left/" + std::to_string(me), std::string("1"));
        }
        return 0;
      },
      std::chrono::seconds(120));
  CHECK(codes == std::vector<int>{0, 0, 0});
  auto inits = lines_starting(log, "init ");
  REQUIRE(inits.size() == 3);
  std::set<std::string> ranks, ids;
  for (const auto& l : inits) {
    CAPTURE(l);
    CHECK(field(l, "nranks") == "3");
    CHECK(field(l, "blocking") == "0");  // ncclConfig_t.blocking = 0
    ranks.insert(field(l, "rank"));
    ids.insert(field(l, "id"));
  }
  CHECK(ranks == std::set<std::string>{"0", "1", "2"});
  CHECK(ids.size() == 1);             // every rank got rank 0's id
  CHECK(ids.begin()->size() == 256);  // NCCL_UNIQUE_ID_BYTES (128), in hex
  CHECK(lines_starting(log, "destroy ").size() == 3);
  CHECK(lines_starting(log, "abort ").empty());  // nothing was pending
}

TEST_CASE("world size 1 on the stand-in: each collective is a copy, ordered and completed") {
  TempDir dir("distopt-nccl-ops");
  const std::string log = dir.path + "/standin.log";
  const int port = free_port();
  const int code = run_one([&] {
    use_standin(log);
    auto ep = make_endpoint("nccl", 0, 1, port);
    Communicator& c = *ep->comm;
    c.set_stream(nullptr);  // the legacy default stream (also the default)
    std::vector<float> a{1, 2, 3, 4}, b(4, 0);
    int64_t sa, sb;
    DLTensor ta = cuda_tensor(a, &sa), tb = cuda_tensor(b, &sb);
    c.allreduce(ta, tb, DOPT_REDUCE_SUM).wait();
    if (b != a) return 2;
    std::fill(b.begin(), b.end(), 0.f);
    c.reduce_scatter(ta, tb, DOPT_REDUCE_AVG).wait();
    if (b != a) return 3;
    c.allreduce(tb, tb, DOPT_REDUCE_AVG).wait();  // in place: the bucket path
    if (b != a) return 15;
    std::fill(b.begin(), b.end(), 0.f);
    c.allgather(ta, tb).wait();
    if (b != a) return 4;
    std::vector<float> root{7, 8, 9, 10};
    int64_t sr;
    DLTensor tr = cuda_tensor(root, &sr);
    c.broadcast(tr, 0).wait();
    if (root != std::vector<float>{7, 8, 9, 10}) return 5;
    // An exchange with itself: send and recv are launched as one group when
    // the recv is waited on first (a lone ncclSend to self would deadlock).
    std::fill(b.begin(), b.end(), 0.f);
    CommRequest s = c.send(ta, 0, 5);
    CommRequest r = c.recv(tb, 0, 5);
    r.wait();
    s.wait();
    if (b != a) return 6;
    // stream_wait: returns at once; the request still reports completion.
    CommRequest q = c.allreduce(ta, ta, DOPT_REDUCE_MAX);
    q.stream_wait(nullptr);
    if (!q.test()) return 7;
    c.barrier().wait();
    // split: color 0 gives a world of 1, color < 0 none.
    auto child = c.split(0, 0);
    if (!child || child->world_size() != 1 || child->rank() != 0) return 8;
    std::fill(b.begin(), b.end(), 0.f);
    child->allreduce(ta, tb, DOPT_REDUCE_SUM).wait();
    if (b != a) return 9;
    child.reset();
    if (c.split(-1, 0) != nullptr) return 10;
    // Arguments: host memory is refused by the host's device rule; another
    // device, a size mismatch and a bad root by the plugin.
    std::vector<float> h(4);
    int64_t sh;
    DLTensor th = make_dltensor(h.data(), 4, dl_f32(), &sh);
    auto [st1, m1] = error_of([&] { c.allreduce(th, th, DOPT_REDUCE_SUM); });
    if (st1 != DOPT_ERR_UNSUPPORTED || !has(m1, "does not accept kDLCPU memory")) return 11;
    int64_t s1;
    DLTensor other = cuda_tensor(b, &s1, 1);
    auto [st2, m2] = error_of([&] { c.allreduce(other, other, DOPT_REDUCE_SUM); });
    if (st2 != DOPT_ERR_INVALID_ARGUMENT || !has(m2, "on CUDA device 1")) return 12;
    std::vector<float> small(3);
    int64_t s3;
    DLTensor ts = cuda_tensor(small, &s3);
    auto [st3, m3] = error_of([&] { c.allreduce(ta, ts, DOPT_REDUCE_SUM); });
    if (st3 != DOPT_ERR_INVALID_ARGUMENT) return 13;
    auto [st4, m4] = error_of([&] { c.broadcast(ta, 1); });
    if (st4 != DOPT_ERR_INVALID_ARGUMENT || !has(m4, "root 1")) return 14;
    c.barrier().wait();  // still usable
    return 0;
  });
  CHECK(code == 0);
  auto splits = lines_starting(log, "split ");
  REQUIRE(splits.size() == 2);
  CHECK(field(splits[0], "color") == "0");
  CHECK(field(splits[0], "blocking") == "0");
  CHECK(field(splits[1], "color") == "-1");  // NCCL_SPLIT_NOCOLOR
  CHECK(lines_starting(log, "group sends=1 recvs=1").size() == 1);
  CHECK(lines_starting(log, "abort ").empty());
  // At one rank the average goes to NCCL as ncclSum (0), never ncclAvg (4),
  // which NCCL runs as a kernel over the whole buffer even in place.
  CHECK(!lines_starting(log, "allreduce op=0 inplace=1").empty());  // and the barriers
  CHECK(lines_starting(log, "allreduce op=4").empty());
  CHECK(lines_starting(log, "reduce_scatter op=0").size() == 1);
}

TEST_CASE("a host-memory request's stream_wait waits like wait (tcp, ABI 1.4 glue)") {
  const int port = free_port();
  CHECK(run_one([&] {
          auto ep = make_endpoint("tcp", 0, 1, port);
          std::vector<float> a{1, 2}, b(2);
          int64_t sa, sb;
          DLTensor ta = make_dltensor(a.data(), 2, dl_f32(), &sa);
          DLTensor tb = make_dltensor(b.data(), 2, dl_f32(), &sb);
          CommRequest q = ep->comm->allreduce(ta, tb, DOPT_REDUCE_SUM);
          q.stream_wait(nullptr);
          if (!q.test() || b != a) return 2;
          auto [st, m] = error_of([&] { ep->comm->set_stream(nullptr); });
          return st == DOPT_ERR_UNSUPPORTED && has(m, "no device streams") ? 0 : 3;
        }) == 0);
}

TEST_CASE("the watchdog aborts a hung operation and fails every pending request, naming it") {
  TempDir dir("distopt-nccl-hang");
  const std::string log = dir.path + "/standin.log";
  const int port = free_port();
  const int code = run_one([&] {
    use_standin(log);
    setenv("DISTOPT_STANDIN_HANG", "op", 1);
    auto ep = make_endpoint("nccl", 0, 1, port, "{timeout_s: 1, watchdog_poll_ms: 20}");
    Communicator& c = *ep->comm;
    std::vector<float> a(8, 1.f), b(8, 0.f);
    int64_t sa, sb;
    DLTensor ta = cuda_tensor(a, &sa), tb = cuda_tensor(b, &sb);
    CommRequest first = c.allreduce(ta, tb, DOPT_REDUCE_SUM);  // never completes
    CommRequest second = c.broadcast(ta, 0);                   // queued behind it
    if (first.test()) return 2;
    auto [st1, m1] = error_of([&] { first.wait(); });  // no limit: the watchdog ends it
    std::fprintf(stderr, "first: %s\n", m1.c_str());
    if (st1 != DOPT_ERR_TIMEOUT) return 3;
    if (!has(m1, "allreduce #1 (8 float32) did not complete within timeout_s")) return 4;
    if (!has(m1, "ncclCommAbort")) return 5;
    auto [st2, m2] = error_of([&] { second.wait(); });
    std::fprintf(stderr, "second: %s\n", m2.c_str());
    if (st2 != DOPT_ERR_TIMEOUT || !has(m2, "broadcast #2 (8 float32) from rank 0 failed"))
      return 6;
    if (!has(m2, "because allreduce #1")) return 7;
    // Aborted: later operations are refused, naming why.
    auto [st3, m3] = error_of([&] { c.barrier(); });
    if (st3 != DOPT_ERR_ABORTED || !has(m3, "was aborted because allreduce #1")) return 8;
    return 0;
  });
  CHECK(code == 0);
  CHECK(lines_starting(log, "abort rank=0").size() == 1);
}

TEST_CASE("an asynchronous NCCL error aborts the communicator; later operations say why") {
  const int port = free_port();
  CHECK(run_one([&] {
          use_standin();
          setenv("DISTOPT_STANDIN_ASYNC_ERROR", "1", 1);  // 200 ms after the first operation
          auto ep = make_endpoint("nccl", 0, 1, port, "{watchdog_poll_ms: 10}");
          std::vector<float> a(4, 1.f);
          int64_t sa;
          DLTensor ta = cuda_tensor(a, &sa);
          ep->comm->allreduce(ta, ta, DOPT_REDUCE_SUM).wait();
          // The error is seen by the watchdog or by a launch's settle,
          // whichever polls first; either aborts the communicator.
          for (int i = 0; i < 60000; ++i) {
            auto [st, m] = error_of([&] { ep->comm->barrier().wait(); });
            if (st == DOPT_OK) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
              continue;
            }
            std::fprintf(stderr, "failed: %s\n", m.c_str());
            if (!has(m, "unhandled system error")) return 2;
            auto [st2, m2] = error_of([&] { ep->comm->barrier(); });
            std::fprintf(stderr, "then: %s\n", m2.c_str());
            return st2 == DOPT_ERR_ABORTED && has(m2, "was aborted because") &&
                           has(m2, "unhandled system error")
                       ? 0
                       : 3;
          }
          return 4;
        }) == 0);
}

TEST_CASE("an init that never settles fails with TIMEOUT naming ncclCommInitRankConfig") {
  TempDir dir("distopt-nccl-init");
  const std::string log = dir.path + "/standin.log";
  const int port = free_port();
  CHECK(run_one([&] {
          use_standin(log);
          setenv("DISTOPT_STANDIN_HANG", "init", 1);
          auto [st, m] = error_of([&] { make_endpoint("nccl", 0, 1, port, "{timeout_s: 0.5}"); });
          std::fprintf(stderr, "create: %s\n", m.c_str());
          return st == DOPT_ERR_TIMEOUT && has(m, "ncclCommInitRankConfig (rank 0 of 1)") ? 0 : 2;
        }) == 0);
  CHECK(lines_starting(log, "abort rank=0").size() == 1);  // the half-made communicator
}

TEST_CASE("an ncclCommAbort that hangs ends the process with a clear message") {
  TempDir dir("distopt-nccl-aborthang");
  const std::string err = dir.path + "/stderr.txt";
  const int port = free_port();
  const int code = run_one([&] {
    if (!std::freopen(err.c_str(), "w", stderr)) return 90;
    use_standin();
    setenv("DISTOPT_STANDIN_HANG", "op", 1);
    setenv("DISTOPT_STANDIN_ABORT_HANG", "1", 1);
    auto ep = make_endpoint("nccl", 0, 1, port,
                            "{timeout_s: 0.5, abort_grace_s: 0.5, watchdog_poll_ms: 20}");
    std::vector<float> a(4, 1.f);
    int64_t sa;
    DLTensor ta = cuda_tensor(a, &sa);
    CommRequest q = ep->comm->allreduce(ta, ta, DOPT_REDUCE_SUM);
    error_of([&] { q.wait(60000); });  // the monitor ends the process meanwhile
    return 3;                          // not reached
  });
  CHECK(code == 134);
  const std::string text = read_text(err);
  CAPTURE(text);
  CHECK(text.find("ncclCommAbort on nccl rank 0 of 1 did not return within abort_grace_s") !=
        std::string::npos);
  CHECK(text.find("allreduce #1 (4 float32) did not complete within timeout_s") !=
        std::string::npos);
  CHECK(text.find("ending the process with exit status 134") != std::string::npos);
}
