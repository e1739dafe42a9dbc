// Conformance: the same basic checks over every communicator the registry
// discovers in DISTOPT_PLUGIN_DIR (tcp today; ucx, nccl, ... when built).
#include <doctest/doctest.h>

#include <cstring>

#include "comm_helpers.hpp"
#include "distopt/error.hpp"

using namespace distopt;
using namespace distopt::test;

namespace {

/// The communicators that accept host memory (this suite's tensors are
/// kDLCPU; a device-only one, e.g. nccl, has its own tests in tests/nccl).
std::vector<std::string> communicators() {
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

}  // namespace

TEST_CASE("conformance: every discovered communicator") {
  auto names = communicators();
  REQUIRE_MESSAGE(!names.empty(), "no communicator found in " << plugin_dir());
  CHECK(std::find(names.begin(), names.end(), "tcp") != names.end());
  for (const auto& name : names) {
    CAPTURE(name);
    const int port = free_port();
    auto codes = fork_ranks(
        2,
        [&](int me) {
          auto ep = make_endpoint(name, me, 2, port);
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
