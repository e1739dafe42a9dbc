// The `ucx` communicator beyond the conformance suite: user send/recv (also
// while a collective runs), split, failure handling (a killed peer is named
// with DOPT_ERR_COMM, a stopped one with DOPT_ERR_TIMEOUT) and no fd or
// /dev/shm left behind by destroy. Each runs on distopt's shared-memory
// collectives (sdk/collective/shm_collectives.hpp, the default on one host), on UCX's
// default transports (shm: false) and on UCX_TLS=tcp (shm: false). Also: the
// plugin's UCX tcp segment sizes reach UCX unless the user set them.
#include <dirent.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm_faults.hpp"
#include "comm_helpers.hpp"
#include "distopt/error.hpp"
#include "tcp_defaults.hpp"

using namespace distopt;
using namespace distopt::test;

namespace {

/// How the collectives move data: UCX_TLS ("": UCX's default choice) and
/// whether the ranks (all on this host) use the SDK's shared memory.
struct Variant {
  const char* tls;
  bool shm;
};
const Variant kVariants[] = {{"", true}, {"", false}, {"tcp", false}};

/// Set UCX_TLS for the ranks forked next ("" unsets it).
void set_tls(const char* tls) {
  if (*tls)
    setenv("UCX_TLS", tls, 1);
  else
    unsetenv("UCX_TLS");
}

/// The communicator's options: `extra` ("timeout_s: 2.0" or "") and shm.
std::string options(const Variant& v, const std::string& extra = "") {
  return "{" + extra + (extra.empty() ? "" : ", ") + "shm: " + (v.shm ? "true" : "false") + "}";
}

size_t count_dir(const char* path) {
  size_t n = 0;
  if (DIR* d = opendir(path)) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

/// /dev/shm entries this process may own: all but the shared-memory
/// segments of other processes ("distopt-<pid>-..."; other jobs on this
/// machine create them for a moment while they connect).
size_t count_shm() {
  size_t n = 0;
  const std::string foreign = "distopt-", own = foreign + std::to_string(getpid()) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(foreign, 0) != 0 || name.rfind(own, 0) == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("ucx: send/recv (also around a running collective) and split") {
  for (const Variant& v : kVariants) {
    CAPTURE(v.tls);
    CAPTURE(v.shm);
    set_tls(v.tls);
    const int port = free_port();
    auto codes = fork_ranks(
        4,
        [&](int me) {
          auto ep = make_endpoint("ucx", me, 4, port, options(v));
          Communicator& c = *ep->comm;
          // A ring of 1 MiB messages: every rank sends and receives at once.
          std::vector<int32_t> out(1 << 18, me), in(1 << 18, -1);
          int64_t s1, s2;
          DLTensor to = make_dltensor(out.data(), 1 << 18, DLDataType{kDLInt, 32, 1}, &s1);
          DLTensor ti = make_dltensor(in.data(), 1 << 18, DLDataType{kDLInt, 32, 1}, &s2);
          auto r = c.recv(ti, (me + 3) % 4, 7);
          // A collective issued between: the user messages still complete.
          std::vector<float> v(100000, 1.0f);
          int64_t s3;
          DLTensor tv = make_dltensor(v.data(), 100000, dl_f32(), &s3);
          auto a = c.allreduce(tv, tv, DOPT_REDUCE_SUM);
          auto s = c.send(to, (me + 1) % 4, 7);
          s.wait();
          r.wait();
          a.wait();
          if (in[0] != (me + 3) % 4 || in.back() != (me + 3) % 4) return 1;
          if (v[0] != 4.0f || v.back() != 4.0f) return 2;
          // Split into even and odd ranks; each half reduces its own ranks.
          auto sub = c.split(me % 2, me);
          if (!sub || sub->world_size() != 2 || sub->rank() != me / 2) return 3;
          float x = static_cast<float>(me);
          int64_t s4;
          DLTensor tx = make_dltensor(&x, 1, dl_f32(), &s4);
          sub->allreduce(tx, tx, DOPT_REDUCE_SUM).wait();
          if (x != (me % 2 == 0 ? 2.0f : 4.0f)) return 4;
          c.barrier().wait();  // the parent still works after the split
          return 0;
        },
        std::chrono::seconds(120));
    for (int r = 0; r < 4; ++r) CHECK(codes[r] == 0);
  }
  unsetenv("UCX_TLS");
}

TEST_CASE("ucx: a receive nobody sends to fails with TIMEOUT after timeout_s, naming the peer") {
  const int port = free_port();
  auto codes = fork_ranks(
      2,
      [&](int me) {
        auto ep = make_endpoint("ucx", me, 2, port, "{timeout_s: 1.0}");
        if (me == 1) {  // alive, but never sends
          ep->store->get("done", std::chrono::seconds(60));
          return 0;
        }
        float x = 0;
        int64_t s;
        DLTensor t = make_dltensor(&x, 1, dl_f32(), &s);
        int rc = 1;
        try {
          ep->comm->recv(t, 1, 5).wait();
        } catch (const CommError& e) {
          rc = e.status() == DOPT_ERR_TIMEOUT && std::strstr(e.what(), "rank 1") ? 0 : 2;
          if (rc) fprintf(stderr, "unexpected: %s\n", e.what());
        }
        ep->store->set("done", std::string("1"));
        return rc;
      },
      std::chrono::seconds(60));
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("ucx: a rank that dies mid-allreduce fails every other rank's wait, naming it") {
  // Rank 2 exits (DISTOPT_FAULT_INJECT, sdk/base/fault_point.hpp) once it has
  // handed UCX 1 MiB of its third operation, a 32 MiB allreduce (the barrier
  // before it: every rank's first allreduce has completed, its rendezvous
  // sends included). timeout_s 600: only failure detection, not the
  // timeout, ends this within the test's limit.
  for (const Variant& v : kVariants) {
    CAPTURE(v.tls);
    CAPTURE(v.shm);
    set_tls(v.tls);
    const int n = 4, dead = 2;
    const int port = free_port();
    setenv("DISTOPT_FAULT_INJECT", ("comm_exit:" + std::to_string(dead) + ":3:1048576").c_str(), 1);
    auto codes = fork_ranks(
        n,
        [&](int me) {
          auto ep = make_endpoint("ucx", me, n, port, options(v, "timeout_s: 600"));
          std::vector<float> buf(8u << 20, 1.0f);
          int64_t s;
          DLTensor t = make_dltensor(buf.data(), static_cast<int64_t>(buf.size()), dl_f32(), &s);
          ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
          ep->comm->barrier().wait();
          return check_dead_peer_named(*ep->comm, t, me, dead);
        },
        std::chrono::seconds(90));
    unsetenv("DISTOPT_FAULT_INJECT");
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(codes[r] == 0);
    }
  }
  unsetenv("UCX_TLS");
}

TEST_CASE("ucx: a stopped peer makes the others time out (DOPT_ERR_TIMEOUT), naming it") {
  for (const Variant& v : kVariants) {
    CAPTURE(v.tls);
    CAPTURE(v.shm);
    set_tls(v.tls);
    const int port = free_port();
    auto codes = fork_ranks(
        3,
        [&](int me) {
          auto ep = make_endpoint("ucx", me, 3, port, options(v, "timeout_s: 2.0"));
          float x = 1;
          int64_t s;
          DLTensor t = make_dltensor(&x, 1, dl_f32(), &s);
          ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();  // everyone is connected
          if (me == 2) {
            stop_self_for(6);
            return 0;
          }
          try {
            ep->comm->allreduce(t, t, DOPT_REDUCE_SUM).wait();
            return 1;
          } catch (const CommError& e) {
            if (e.status() != DOPT_ERR_TIMEOUT || !std::strstr(e.what(), "rank 2")) {
              fprintf(stderr, "rank %d: unexpected error: %s\n", me, e.what());
              return 2;
            }
          }
          return 0;
        },
        std::chrono::seconds(60));
    for (int r = 0; r < 3; ++r) CHECK(codes[r] == 0);
  }
  unsetenv("UCX_TLS");
}

TEST_CASE("ucx: destroy leaves no file descriptor and no /dev/shm entry behind") {
  for (const Variant& v : kVariants) {
    CAPTURE(v.tls);
    CAPTURE(v.shm);
    set_tls(v.tls);
    const int port = free_port();
    auto codes = fork_ranks(
        2,
        [&](int me) {
          auto ep = make_endpoint("ucx", me, 2, port, options(v));  // store + a first comm
          auto cycle = [&](int i) {
            // A new communicator in its own scope, used with a large message
            // (rendezvous, shared memory or CMA lanes), then destroyed.
            dopt_create_args a{};
            a.struct_size = sizeof a;
            a.rank = me;
            a.world_size = 2;
            a.local_rank = me;
            a.local_world_size = 2;
            a.options = ep->options.c_handle();
            a.store = reinterpret_cast<dopt_store*>(ep->store.get());
            const std::string scope = "cycle" + std::to_string(i);
            a.scope = scope.c_str();
            a.job_token = "test-token";
            auto c =
                std::make_unique<Communicator>(ep->registry.get(DOPT_KIND_COMMUNICATOR, "ucx"), a);
            std::vector<float> v(4u << 20, 1.0f);
            int64_t s;
            DLTensor t = make_dltensor(v.data(), static_cast<int64_t>(v.size()), dl_f32(), &s);
            c->allreduce(t, t, DOPT_REDUCE_SUM).wait();
            c->barrier().wait();
          };
          cycle(0);  // UCX's process-wide state (async thread, ...) is set up once
          const size_t fds = count_dir("/proc/self/fd"), shm = count_shm();
          for (int i = 1; i <= 3; ++i) cycle(i);
          const size_t fds2 = count_dir("/proc/self/fd"), shm2 = count_shm();
          // Fewer is fine (UCX closes some lazily); more is a leak.
          if (fds2 > fds) {
            fprintf(stderr, "rank %d: %zu fds before, %zu after\n", me, fds, fds2);
            return 1;
          }
          if (shm2 > shm) {
            fprintf(stderr, "rank %d: /dev/shm %zu entries before, %zu after\n", me, shm, shm2);
            return 2;
          }
          return 0;
        },
        std::chrono::seconds(120));
    for (int r = 0; r < 2; ++r) CHECK(codes[r] == 0);
  }
  unsetenv("UCX_TLS");
}

namespace {

/// `ucp_ep_print_info` of an endpoint from a UCX_TLS=tcp worker to itself,
/// its config modified by the plugin's apply_tcp_defaults (the plugin's own
/// code path). The "tag_send" line shows where rendezvous begins, which
/// UCX_TCP_TX_SEG_SIZE sets.
std::string tcp_ep_info() {
  using namespace distopt::plugins::ucx;
  setenv("UCX_TLS", "tcp", 1);
  ucp_config_t* config = nullptr;
  REQUIRE(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
  std::string failed;
  REQUIRE(apply_tcp_defaults(config, &failed) == UCS_OK);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h ctx = nullptr;
  REQUIRE(ucp_init(&params, config, &ctx) == UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  ucp_worker_h worker = nullptr;
  REQUIRE(ucp_worker_create(ctx, &wp, &worker) == UCS_OK);
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  REQUIRE(ucp_worker_get_address(worker, &addr, &len) == UCS_OK);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = addr;
  ucp_ep_h h = nullptr;
  REQUIRE(ucp_ep_create(worker, &ep, &h) == UCS_OK);
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  ucp_ep_print_info(h, f);
  std::fclose(f);
  std::string info(buf, size);
  std::free(buf);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(h, &prm);
  if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
  ucp_worker_release_address(worker, addr);
  ucp_worker_destroy(worker);
  ucp_cleanup(ctx);
  unsetenv("UCX_TLS");
  return info;
}

/// The "tag_send:" line of ucp_ep_print_info's output.
std::string tag_send_line(const std::string& info) {
  const size_t at = info.find("tag_send:");
  REQUIRE_MESSAGE(at != std::string::npos, info);
  return info.substr(at, info.find('\n', at) - at);
}

}  // namespace

TEST_CASE("ucx: the plugin's tcp segment sizes apply unless the user set UCX_TCP_*_SEG_SIZE") {
  using namespace distopt::plugins::ucx;
  unsetenv("UCX_TCP_TX_SEG_SIZE");
  unsetenv("UCX_TCP_RX_SEG_SIZE");
  static const char* user_rx = nullptr;
  const auto env = [](const char* name) -> const char* {
    return std::strcmp(name, "UCX_TCP_RX_SEG_SIZE") == 0 ? user_rx : nullptr;
  };
  CHECK(tcp_defaults_to_apply(env).size() == 2);
  user_rx = "64K";
  const auto left = tcp_defaults_to_apply(env);
  REQUIRE(left.size() == 1);
  CHECK(left[0].name == "TCP_TX_SEG_SIZE");
  user_rx = nullptr;

  // In UCX itself: the 64 KiB tx segment moves rendezvous from 8 KiB
  // (UCX's 8 KiB segment) to 64 KiB; a user's 8K wins.
  CHECK(tag_send_line(tcp_ep_info()).find("65536..<rndv>") != std::string::npos);
  setenv("UCX_TCP_TX_SEG_SIZE", "8K", 1);
  const std::string user = tag_send_line(tcp_ep_info());
  unsetenv("UCX_TCP_TX_SEG_SIZE");
  CHECK_MESSAGE(user.find("8192..<rndv>") != std::string::npos, user);
}
