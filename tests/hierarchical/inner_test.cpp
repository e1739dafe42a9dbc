// ABI 1.3 inner reducers: `reducer: {name: hierarchical, ..., inner: {name,
// options}}` validated at check time against the inner's own schema and
// refused where the combination is wrong (`distopt check`, naming
// file:line:column and the key), the host services that find and create
// the inner (dopt_host_api::inner_reducer / create_inner_reducer, through
// the SDK's InnerReducer), and the traits the job reports.
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "distopt/config.hpp"
#include "distopt/host_api.hpp"
#include "distopt/host_communicator.hpp"
#include "distopt/registry.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sdk/base/inner_reducer.hpp"
#include "distopt/sdk/base/tensor.hpp"
#include "job_yaml.hpp"
#include "multiproc.hpp"
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

using distopt::test::env_path;
using distopt::test::run_command;

namespace {

// A job file: line 1 plugins, 2 world, 3 algorithm, 4 reducer.
std::string write_job(const std::string& dir, const std::string& name, const std::string& reducer,
                      const std::string& algorithm = "{name: allreduce}") {
  distopt::test::JobYaml j;
  j.world = 4;
  j.algorithm = algorithm;
  j.reducer = reducer;
  return distopt::test::write_job(dir + "/" + name, j);
}

const char* kPowerSgd = "{name: powersgd, options: {rank: 2}}";

}  // namespace

TEST_CASE("distopt check: bad inner reducers are refused at file:line, naming the key") {
  const std::string cli = env_path("DISTOPT_CLI");
  distopt::test::TempDir dir("distopt_hier_check");
  struct Case {
    std::string reducer, algorithm, where, why;
  };
  const std::string leader = "{name: hierarchical, options: {variant: leader}, ";
  const Case cases[] = {
      // The inner's own schema: a range, an unknown key, nesting.
      {leader + "inner: {name: powersgd, options: {rank: 0}}}", "{name: allreduce}",
       ":4:99: reducer.inner.options.rank", "out of range [1, 65536]"},
      {leader + "inner: {name: powersgd, options: {rnak: 2}}}", "{name: allreduce}",
       ":4:93: unknown key 'rnak' in reducer.inner.options", "did you mean 'rank'?"},
      {leader + "inner: {name: powersgd, inner: {name: mean}}}", "{name: allreduce}",
       ":4:83: unknown key 'inner' in reducer.inner", "valid keys: name, options"},
      {leader + "inner: {name: nosuch}}", "{name: allreduce}", ":4:73: reducer.inner.name",
       "nosuch"},
      // Only a reducer that wraps another takes `inner:`.
      {"{name: mean, inner: {name: powersgd}}", "{name: allreduce}", ":4:23: reducer.inner",
       "reducer 'mean' (plugin mean) does not wrap another reducer"},
      // hierarchical's check_job: the ring variant does not take an inner.
      {"{name: hierarchical, options: {variant: ring}, inner: " + std::string(kPowerSgd) + "}",
       "{name: allreduce}", ":4:50: reducer.options.variant",
       "reducer 'hierarchical' refuses this job: an inner reducer runs between the node leaders"},
      {leader + "inner: {name: hierarchical}}", "{name: allreduce}", ":4:73: reducer.inner.name",
       "which wraps another itself"},
      // A lossy inner makes the whole reducer inexact: ZeRO stage 2 would bypass it.
      {leader + "inner: " + kPowerSgd + "}", "{name: zero, options: {stage: 2}}",
       ":3:42: algorithm.options.stage", "reducer 'hierarchical' (plugin hierarchical) would not"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string job =
        write_job(dir.path, "bad" + std::to_string(i++) + ".yaml", c.reducer, c.algorithm);
    auto r = run_command({cli, "check", job}, {}, std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(job + c.where) != std::string::npos);
    CHECK(r.output.find(c.why) != std::string::npos);
  }
  // Accepted: an inner with the leader variant; hierarchical alone (exact) or
  // with an exact inner under ZeRO stage 2.
  struct Ok {
    std::string reducer, algorithm, summary;
  };
  for (const Ok& c : {Ok{leader + "inner: " + kPowerSgd + "}", "{name: allreduce}",
                         "reducer hierarchical (inner powersgd), algorithm allreduce"},
                      Ok{"{name: hierarchical}", "{name: zero, options: {stage: 2}}",
                         "reducer hierarchical, algorithm zero"},
                      Ok{leader + "inner: {name: mean}}", "{name: zero, options: {stage: 2}}",
                         "reducer hierarchical (inner mean), algorithm zero"}}) {
    auto r = run_command({cli, "check", write_job(dir.path, "ok.yaml", c.reducer, c.algorithm)}, {},
                         std::chrono::seconds(60));
    INFO(c.reducer << " / " << c.algorithm << "\n" << r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find(c.summary) != std::string::npos);
  }
  // An inner reducer's own check_job is asked too; the key it names as a
  // top-level reducer would is read below `reducer.inner`.
  {
    const std::string job =
        write_job(dir.path, "veto.yaml", leader + "inner: {name: veto, options: {level: 3}}}");
    auto r = run_command({cli, "check", job, "-P", DISTOPT_HIER_TEST_PLUGIN_DIR}, {},
                         std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(job +
                        ":4:96: reducer.inner.options.level: inner reducer 'veto' refuses this "
                        "job: veto: level 3 is refused (outer reducer 'hierarchical')") !=
          std::string::npos);
    auto ok = run_command(
        {cli, "check",
         write_job(dir.path, "veto_ok.yaml", leader + "inner: {name: veto, options: {level: 2}}}"),
         "-P", DISTOPT_HIER_TEST_PLUGIN_DIR},
        {}, std::chrono::seconds(60));
    INFO(ok.output);
    CHECK(ok.exit_code == 0);
  }
  auto p = run_command({cli, "plugins", "-P", env_path("DISTOPT_PLUGIN_DIR")}, {},
                       std::chrono::seconds(60));
  CHECK(p.output.find("wraps an `inner:` reducer") != std::string::npos);
}

TEST_CASE(
    "host services (ABI 1.3): the inner's name and traits, and an instance over a communicator") {
  // The Runtime validates the job as every program does (and owns the registry).
  distopt::Runtime rt = distopt::test::rank_runtime(
      distopt::test::plugins_and_world_yaml(1, distopt::test::random_port()) +
          "reducer: {name: hierarchical, options: {variant: leader}, inner: {name: mean}}\n",
      0, 1, "inner.yaml");
  const distopt::ValidatedJob v = distopt::validate_job(rt.config(), rt.registry(), 1);
  const dopt_host_api* h = distopt::host_api();
  REQUIRE(h->struct_size >= DOPT_HOST_API_V1_3_STRUCT_SIZE);
  REQUIRE(distopt::sdk::host_has_inner_reducers(h));

  auto info = distopt::sdk::inner_reducer_info(v.reducer.c_handle(), h);
  REQUIRE(info.has_value());
  CHECK(info->name == "mean");
  CHECK(info->exact_mean());
  CHECK_FALSE(distopt::sdk::inner_reducer_info(v.algorithm.c_handle(), h).has_value());
  CHECK(h->inner_reducer(nullptr, nullptr, nullptr) == DOPT_ERR_INVALID_ARGUMENT);

  // A bucket of 5 floats, reduced by the inner `mean` on one rank: unchanged.
  at::Tensor flat = at::arange(5, at::kFloat);
  distopt::sdk::DLView view(flat);
  const int64_t shape[] = {5};
  dopt_bucket_entry e{};
  e.struct_size = DOPT_BUCKET_ENTRY_STRUCT_SIZE;
  e.name = "w";
  e.numel = 5;
  e.ndim = 1;
  e.shape = shape;
  dopt_bucket b{};
  b.struct_size = DOPT_BUCKET_STRUCT_SIZE;
  b.flat = view.get();
  b.entries = &e;
  b.num_entries = 1;
  dopt_create_args a{};
  a.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  a.world_size = 1;
  a.local_world_size = 1;
  a.scope = "test/inner";
  const distopt::sdk::CommView comm(rt.communicator().ref());
  {
    distopt::sdk::InnerReducer inner(v.reducer.c_handle(), a, comm, &b, 1, h);
    REQUIRE(static_cast<bool>(inner));
    inner.reduce(b).wait();
    CHECK(at::equal(flat, at::arange(5, at::kFloat)));
    CHECK(inner.bytes_sent() == 0);
    CHECK(inner.has_state_io());
  }
  // No inner configured: the host says so (DOPT_ERR_STATE) and creates nothing.
  const dopt_comm_ref ref = rt.communicator().ref();
  dopt_reducer_ref out{nullptr, nullptr};
  CHECK(h->create_inner_reducer(v.algorithm.c_handle(), &a, &ref, &b, 1, &out) == DOPT_ERR_STATE);
  CHECK(out.reducer == nullptr);
  CHECK(distopt::take_last_error().find("no `inner:` reducer") != std::string::npos);
}
