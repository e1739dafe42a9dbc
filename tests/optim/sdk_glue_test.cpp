// The SDK's C++ glue: DOPT_PLUGIN's entry, exception -> status mapping with
// the message in the host's error sink, requests, typed options.
#include <doctest/doctest.h>

#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "distopt/component_options.hpp"
#include "distopt/host_api.hpp"
#include "distopt/sdk/sdk.hpp"

namespace {

using namespace distopt;

// Throws from its constructor according to args.rank (1..4), else works:
// reduce() returns a request the test completes by hand.
struct TestReducer : sdk::Reducer {
  static constexpr uint32_t traits = DOPT_TRAIT_EXACT_MEAN;  // ABI 1.2, found by DOPT_COMPONENT
  static inline std::shared_ptr<sdk::Completion> last;
  static inline std::string op;  // names the next request's Completion ("": none)
  TestReducer(const dopt_create_args& args, dopt_comm_ref, const dopt_bucket*, size_t) {
    switch (args.rank) {
      case 1:
        throw std::invalid_argument("bad bucket layout");
      case 2:
        throw std::bad_alloc();
      case 3:
        throw sdk::Error(DOPT_ERR_COMM, "peer 3 died");
      case 4:
        throw std::runtime_error("surprise");
      default:
        break;
    }
    sdk::OptionsView o(args.options);
    factor_ = o.get_double("factor");
  }
  std::unique_ptr<sdk::Request> reduce(const dopt_bucket&) override {
    last = std::make_shared<sdk::Completion>(op);
    return std::make_unique<sdk::CompletionRequest>(last, op.empty() ? 50 : -1);
  }
  uint64_t bytes_sent() const override { return static_cast<uint64_t>(factor_); }
  double factor_ = 0;
};

struct TestAlgorithm : sdk::Algorithm {
  // ABI 1.2 job check: refuses adam (naming the key) and more than 8 ranks
  // (an sdk::Error: status and error sink, no key).
  static void check_job(const sdk::JobView& job) {
    if (job.optimizer_name() == "adam")
      job.reject("optimizer.name", "testalg runs sgd only, got " + job.optimizer_name());
    if (job.world_size() > 8) throw sdk::Error(DOPT_ERR_UNSUPPORTED, "at most 8 ranks");
  }
  explicit TestAlgorithm(const dopt_algorithm_args&) {}
  void on_bucket_ready(const dopt_bucket&) override {}
  void step() override { throw sdk::Error(DOPT_ERR_STATE, "step before ready"); }
  void set_lr(int32_t, double) override {}
  uint64_t state_bytes() const override { return 42; }
};

constexpr dopt_option_spec kTestOptions[] = {
    sdk::option_double("factor", "7", "a factor").range(0, 100),
};

}  // namespace

DOPT_PLUGIN("testplug", "0.1.0",
            DOPT_COMPONENT(TestReducer, "testred", "0.2.0", "test reducer", kTestOptions),
            DOPT_COMPONENT(TestAlgorithm, "testalg", "0.3.0", "test algorithm", nullptr))

namespace {

dopt_plugin_info init_plugin() {
  dopt_plugin_info info{};
  info.struct_size = DOPT_PLUGIN_INFO_STRUCT_SIZE;
  REQUIRE(dopt_plugin_init_v1(host_api(), &info) == DOPT_OK);
  return info;
}

}  // namespace

TEST_CASE("DOPT_PLUGIN fills the plugin info and component table") {
  dopt_plugin_info info = init_plugin();
  CHECK(info.abi_major == DOPT_ABI_VERSION_MAJOR);
  CHECK(info.abi_minor == DOPT_ABI_VERSION_MINOR);
  CHECK(std::string(info.plugin_name) == "testplug");
  REQUIRE(info.num_components == 2);
  CHECK(info.components[0].kind == DOPT_KIND_REDUCER);
  CHECK(std::string(info.components[0].name) == "testred");
  CHECK(info.components[0].num_options == 1);
  CHECK(info.components[0].struct_size == DOPT_COMPONENT_V1_4_STRUCT_SIZE);
  CHECK(info.components[0].devices == 0);  // no static `devices`: kDLCPU only
  CHECK(info.components[0].traits == DOPT_TRAIT_EXACT_MEAN);
  CHECK((info.components[0].check_job == nullptr));  // the class has no check_job
  CHECK(info.components[1].traits == 0);
  CHECK((info.components[1].check_job != nullptr));
  CHECK(info.components[1].kind == DOPT_KIND_ALGORITHM);
  CHECK(info.components[1].options == nullptr);
  CHECK(info.components[1].num_options == 0);
  auto* rvt = static_cast<const dopt_reducer_v1*>(info.components[0].vtable);
  CHECK(rvt->struct_size == DOPT_REDUCER_V1_1_STRUCT_SIZE);
  CHECK(reinterpret_cast<void*>(rvt->create) != nullptr);
  CHECK(reinterpret_cast<void*>(rvt->bytes_sent) != nullptr);
  CHECK(reinterpret_cast<void*>(rvt->save_state) != nullptr);
  CHECK(reinterpret_cast<void*>(rvt->load_state) != nullptr);
  auto* avt = static_cast<const dopt_algorithm_v1*>(info.components[1].vtable);
  CHECK(avt->struct_size == DOPT_ALGORITHM_V1_9_STRUCT_SIZE);
  CHECK(reinterpret_cast<void*>(avt->bytes_sent) != nullptr);
  // ABI 1.5: present; the SDK's default refuses (this class does not clip)
  REQUIRE(reinterpret_cast<void*>(avt->set_grad_clip) != nullptr);
  // ABI 1.7: a class without a static param_sharding shards nothing, and
  // its gather refuses.
  REQUIRE(reinterpret_cast<void*>(avt->param_sharding) != nullptr);
  CHECK(avt->param_sharding(nullptr) == DOPT_PARAM_SHARDING_NONE);
  REQUIRE(reinterpret_cast<void*>(avt->gather_params) != nullptr);
  REQUIRE(reinterpret_cast<void*>(avt->wait_params) != nullptr);
  REQUIRE(reinterpret_cast<void*>(avt->scatter_params) != nullptr);
  CHECK(avt->gather_params(nullptr, nullptr, nullptr) == DOPT_ERR_INVALID_ARGUMENT);
  // ABI 1.8: a class without discard_step() leaves the pointer NULL (the
  // host then refuses parameter sharding under mixed precision).
  CHECK(reinterpret_cast<void*>(avt->discard_step) == nullptr);
  // ABI 1.9: present; the SDK's default keeps reading the buckets.
  REQUIRE(reinterpret_cast<void*>(avt->finish_buckets) != nullptr);
  int32_t finished = -1;
  CHECK(avt->finish_buckets(nullptr, &finished) == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(sdk::host() == host_api());
}

namespace {
struct Refusal {
  int calls = 0;
  std::string key, message;
};
struct TestJob {
  dopt_job job{};  // first: the callback casts back
  Refusal* refusal = nullptr;
};
void record_reject(const dopt_job* j, const char* key, const char* message) {
  auto* r = reinterpret_cast<const TestJob*>(j)->refusal;
  ++r->calls;
  r->key = key;
  r->message = message;
}
}  // namespace

TEST_CASE("a static check_job becomes dopt_component::check_job; reject names the key") {
  dopt_plugin_info info = init_plugin();
  auto check = info.components[1].check_job;
  REQUIRE((check != nullptr));
  Refusal refusal;
  TestJob t;
  t.refusal = &refusal;
  t.job.struct_size = DOPT_JOB_STRUCT_SIZE;
  t.job.world_size = 2;
  t.job.optimizer_name = "sgd";
  t.job.precision_dtype = "fp32";
  t.job.reject = &record_reject;
  CHECK(check(&t.job) == DOPT_OK);
  CHECK(refusal.calls == 0);

  t.job.optimizer_name = "adam";
  take_last_error();
  CHECK(check(&t.job) == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(refusal.calls == 1);
  CHECK(refusal.key == "optimizer.name");
  CHECK(refusal.message == "testalg runs sgd only, got adam");

  t.job.optimizer_name = "sgd";
  t.job.world_size = 9;
  take_last_error();
  CHECK(check(&t.job) == DOPT_ERR_UNSUPPORTED);
  CHECK(refusal.calls == 1);  // no key: only the error sink
  CHECK(take_last_error() == "at most 8 ranks");

  // A view older than 1.2's or a NULL job is refused before any C++ runs.
  t.job.struct_size = DOPT_STRUCT_SIZE_UPTO(dopt_job, precision_dtype);
  CHECK(check(&t.job) == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(check(nullptr) == DOPT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("the entry refuses another ABI major and a NULL info") {
  dopt_host_api other = *host_api();
  other.abi_major = DOPT_ABI_VERSION_MAJOR + 1;
  dopt_plugin_info info{};
  info.struct_size = DOPT_PLUGIN_INFO_STRUCT_SIZE;
  CHECK(dopt_plugin_init_v1(&other, &info) == DOPT_ERR_UNSUPPORTED);
  CHECK(info.components == nullptr);
  CHECK(dopt_plugin_init_v1(host_api(), nullptr) == DOPT_ERR_INVALID_ARGUMENT);
}

TEST_CASE("exceptions become statuses with the message in the error sink") {
  dopt_plugin_info info = init_plugin();
  auto* rvt = static_cast<const dopt_reducer_v1*>(info.components[0].vtable);
  Options opts = Options::validate(YAML::Load("{factor: 3}"), specs_from_c(kTestOptions, 1),
                                   "<test>", "reducer.options");
  dopt_create_args args{};
  args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  args.world_size = 8;
  args.options = opts.c_handle();
  struct Case {
    int rank;
    dopt_status status;
    const char* msg;
  };
  for (Case c : {Case{1, DOPT_ERR_INVALID_ARGUMENT, "bad bucket layout"},
                 Case{2, DOPT_ERR_NO_MEMORY, "out of memory"},
                 Case{3, DOPT_ERR_COMM, "peer 3 died"}, Case{4, DOPT_ERR_INTERNAL, "surprise"}}) {
    CAPTURE(c.rank);
    args.rank = c.rank;
    take_last_error();
    dopt_reducer* r = reinterpret_cast<dopt_reducer*>(0x1);
    CHECK(rvt->create(&args, dopt_comm_ref{nullptr, nullptr}, nullptr, 0, &r) == c.status);
    CHECK(r == nullptr);
    CHECK(take_last_error() == c.msg);
  }
  // NULL arguments are refused before any C++ runs.
  CHECK(rvt->create(nullptr, dopt_comm_ref{nullptr, nullptr}, nullptr, 0, nullptr) ==
        DOPT_ERR_INVALID_ARGUMENT);

  auto* avt = static_cast<const dopt_algorithm_v1*>(info.components[1].vtable);
  dopt_algorithm_args aargs{};
  aargs.struct_size = DOPT_ALGORITHM_ARGS_STRUCT_SIZE;
  dopt_algorithm* a = nullptr;
  REQUIRE(avt->create(&aargs, &a) == DOPT_OK);
  take_last_error();
  CHECK(avt->step(a) == DOPT_ERR_STATE);
  CHECK(take_last_error() == "step before ready");
  CHECK(avt->state_bytes(a) == 42);
  int32_t finished = -1;  // ABI 1.9: the SDK's default keeps reading the buckets
  CHECK(avt->finish_buckets(a, &finished) == DOPT_OK);
  CHECK(finished == 0);
  CHECK(avt->destroy(a) == DOPT_OK);
}

// The test plugin's reducer, created through the generated glue on 1 rank.
struct GlueReducer {
  const dopt_reducer_v1* rvt = nullptr;
  dopt_reducer* r = nullptr;
  Options opts;
  GlueReducer()
      : opts(Options::validate(YAML::Node(), specs_from_c(kTestOptions, 1), "<test>",
                               "reducer.options")) {
    dopt_plugin_info info = init_plugin();
    rvt = static_cast<const dopt_reducer_v1*>(info.components[0].vtable);
    dopt_create_args args{};
    args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
    args.world_size = 1;
    args.options = opts.c_handle();
    REQUIRE(rvt->create(&args, dopt_comm_ref{nullptr, nullptr}, nullptr, 0, &r) == DOPT_OK);
  }
};

TEST_CASE("requests: test, wait, failure and timeout through the glue") {
  GlueReducer g;
  const dopt_reducer_v1* rvt = g.rvt;
  dopt_reducer* r = g.r;
  CHECK(rvt->bytes_sent(r) == 7);  // the schema default reached the constructor

  dopt_bucket bucket{};
  bucket.struct_size = DOPT_BUCKET_STRUCT_SIZE;
  dopt_reduce_request* q = nullptr;
  REQUIRE(rvt->reduce(r, &bucket, &q) == DOPT_OK);
  int32_t done = 1;
  CHECK(rvt->test(q, &done) == DOPT_OK);
  CHECK(done == 0);
  take_last_error();
  CHECK(rvt->wait(q, 10) == DOPT_ERR_TIMEOUT);
  CHECK(take_last_error().find("timed out") != std::string::npos);
  std::thread worker([c = TestReducer::last] { c->complete(); });
  worker.join();
  CHECK(rvt->wait(q, 1000) == DOPT_OK);
  CHECK(rvt->test(q, &done) == DOPT_OK);
  CHECK(done == 1);
  rvt->request_free(q);

  REQUIRE(rvt->reduce(r, &bucket, &q) == DOPT_OK);
  TestReducer::last->complete(DOPT_ERR_COMM, "rank 1 closed the connection during allreduce");
  take_last_error();
  CHECK(rvt->wait(q, 1000) == DOPT_ERR_COMM);
  CHECK(take_last_error() == "rank 1 closed the connection during allreduce");
  done = 0;
  CHECK(rvt->test(q, &done) == DOPT_ERR_COMM);
  CHECK(done == 1);  // a failed request has completed (distopt/communicator.h)
  rvt->request_free(q);
  rvt->request_free(nullptr);
  CHECK(rvt->destroy(r) == DOPT_OK);
}

TEST_CASE("a Completion that names its operation words the timeout") {
  GlueReducer g;
  const dopt_reducer_v1* rvt = g.rvt;
  dopt_reducer* r = g.r;
  dopt_bucket bucket{};
  bucket.struct_size = DOPT_BUCKET_STRUCT_SIZE;
  TestReducer::op = "allreduce";
  dopt_reduce_request* q = nullptr;
  REQUIRE(rvt->reduce(r, &bucket, &q) == DOPT_OK);
  TestReducer::op.clear();
  CHECK(TestReducer::last->op() == "allreduce");
  take_last_error();
  CHECK(rvt->wait(q, 10) == DOPT_ERR_TIMEOUT);
  CHECK(take_last_error() == "allreduce: not complete after waiting 10 ms");
  int32_t done = 1;
  CHECK(rvt->test(q, &done) == DOPT_OK);  // a timed-out wait leaves it running
  CHECK(done == 0);
  std::thread worker([c = TestReducer::last] { c->complete(); });
  CHECK(rvt->wait(q, -1) == DOPT_OK);  // < 0 without a default: until it completes
  worker.join();
  rvt->request_free(q);
  CHECK(rvt->destroy(r) == DOPT_OK);
}

TEST_CASE("OptionsView: typed getters and errors naming the option") {
  init_plugin();
  Options opts =
      Options::validate(YAML::Load("{factor: 2.5}"), specs_from_c(kTestOptions, 1), "<test>", "x");
  sdk::OptionsView v(opts.c_handle());
  CHECK(v.get_double("factor") == doctest::Approx(2.5));
  try {
    v.get_bool("factor");
    FAIL("expected an error");
  } catch (const sdk::Error& e) {
    CHECK(e.status() == DOPT_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("factor") != std::string::npos);
  }
  CHECK_THROWS_AS(v.get_int("missing"), sdk::Error);
  sdk::OptionsView hostless(opts.c_handle(), nullptr);
  CHECK_THROWS_AS(hostless.get_double("factor"), sdk::Error);
}

TEST_CASE("sdk::guard maps exception types") {
  CHECK(sdk::guard([] {}) == DOPT_OK);
  CHECK(sdk::guard([] { return DOPT_IN_PROGRESS; }) == DOPT_IN_PROGRESS);
  CHECK(sdk::guard([] { throw std::invalid_argument("x"); }) == DOPT_ERR_INVALID_ARGUMENT);
  CHECK(sdk::guard([] { throw 5; }) == DOPT_ERR_INTERNAL);
  // A status from a nested call keeps the nested call's message.
  take_last_error();
  sdk::set_error("peer 2 died during allgather");
  CHECK(sdk::guard([] { sdk::check(DOPT_ERR_COMM, "allgather"); }) == DOPT_ERR_COMM);
  CHECK(take_last_error() == "peer 2 died during allgather");
  CHECK(sdk::Error(DOPT_OK, "x").status() == DOPT_ERR_INTERNAL);
}
