// The plugin registry against mock plugins built from one source with -D
// variants (tests/registry/mock_plugin.c): each broken library is skipped with
// a message naming the file and the reason, the good ones still load.
#include "distopt/registry.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>  // multiproc.hpp uses strdup without including it
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "distopt/communicator.h"
#include "distopt/error.hpp"
#include "distopt/host_communicator.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"

using distopt::PluginError;
using distopt::PluginRegistry;

namespace {

const std::string kMockDir = DISTOPT_MOCK_PLUGIN_DIR;

std::string mock(const std::string& suffix) { return kMockDir + "/libdistopt_" + suffix + ".so"; }

const distopt::SkippedPlugin* skipped_file(const PluginRegistry& reg, const std::string& file) {
  for (const auto& s : reg.skipped())
    if (s.file == file) return &s;
  return nullptr;
}

bool library_mapped(const std::string& file) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(file) != std::string::npos) return true;
  return false;
}

struct TempDir {
  std::string path = distopt::test::make_temp_dir("distopt-registry");
  ~TempDir() { distopt::test::remove_tree(path); }
};

}  // namespace

TEST_CASE("kind_name names each kind") {
  CHECK(std::string(distopt::kind_name(DOPT_KIND_COMMUNICATOR)) == "communicator");
  CHECK(std::string(distopt::kind_name(DOPT_KIND_REDUCER)) == "reducer");
  CHECK(std::string(distopt::kind_name(DOPT_KIND_ALGORITHM)) == "algorithm");
}

TEST_CASE("discover: good mock plugins load, each broken one is skipped with its reason") {
  PluginRegistry reg;
  reg.discover({kMockDir});

  // The good library and the newer-minor one loaded.
  REQUIRE(reg.find(DOPT_KIND_COMMUNICATOR, "mock") != nullptr);
  CHECK(reg.find(DOPT_KIND_COMMUNICATOR, "mock")->file == mock("mock"));
  CHECK(reg.find(DOPT_KIND_REDUCER, "mock") != nullptr);
  CHECK(reg.find(DOPT_KIND_ALGORITHM, "mock") != nullptr);
  CHECK(reg.find(DOPT_KIND_ALGORITHM, "mock_req") != nullptr);
  CHECK(reg.find(DOPT_KIND_COMMUNICATOR, "mock_minor") != nullptr);
  CHECK(reg.find(DOPT_KIND_REDUCER, "mock_minor") != nullptr);
  CHECK(reg.find(DOPT_KIND_REDUCER, "mock_v11") != nullptr);  // an ABI 1.1 layout
  CHECK(reg.find(DOPT_KIND_ALGORITHM, "mock_v11") != nullptr);
  CHECK(reg.find(DOPT_KIND_COMMUNICATOR, "mock_v13") != nullptr);   // an ABI 1.3 layout
  CHECK(reg.find(DOPT_KIND_COMMUNICATOR, "mock_cuda") != nullptr);  // ABI 1.4 devices
  CHECK(reg.components().size() == 12);
  // A library failing a check is skipped as a whole, even its valid components.
  CHECK(reg.find(DOPT_KIND_REDUCER, "mock_nullfn_ok") == nullptr);
  CHECK(reg.find(DOPT_KIND_REDUCER, "mock_dup_only") == nullptr);
  // Kinds are separate namespaces: "mock" is both a communicator and a reducer.
  CHECK(reg.find(DOPT_KIND_ALGORITHM, "mock_minor") == nullptr);

  const std::map<std::string, std::vector<std::string>> expected = {
      {"junk", {"cannot be loaded"}},
      {"mock_badmajor",
       {"built for plugin ABI 2.0", "this host speaks ABI " +
                                        std::to_string(DOPT_ABI_VERSION_MAJOR) + "." +
                                        std::to_string(DOPT_ABI_VERSION_MINOR)}},
      {"mock_noentry", {"missing the entry symbol dopt_plugin_init_v1"}},
      {"mock_nullfn", {"component 'mock_nullfn': communicator vtable field 'allreduce' is NULL"}},
      {"mock_dup", {"duplicate communicator 'mock': already provided by " + mock("mock")}},
      {"mock_initfail",
       {"dopt_plugin_init_v1 failed (UNSUPPORTED)", "the required device is not present"}},
      {"mock_baddefault",
       {"component 'mock_baddefault'", "option 'count' has an invalid default 'many'"}},
      {"mock_small", {"struct_size 16 is smaller than the ABI v1.0 size"}},
      {"mock_missingdep", {"cannot be loaded", "libmock_dep.so"}},
  };
  CHECK(reg.skipped().size() == expected.size());
  for (const auto& [suffix, needles] : expected) {
    CAPTURE(suffix);
    const auto* s = skipped_file(reg, mock(suffix));
    REQUIRE(s != nullptr);
    for (const auto& n : needles) {
      CAPTURE(s->reason);
      CHECK(s->reason.find(n) != std::string::npos);
    }
  }
}

TEST_CASE("a newer ABI minor loads; larger structs are read with their own stride") {
  PluginRegistry reg;
  REQUIRE(reg.load_file(mock("mock_minor")));
  const auto& c = reg.get(DOPT_KIND_COMMUNICATOR, "mock_minor");
  CHECK(c.abi_major == DOPT_ABI_VERSION_MAJOR);
  CHECK(c.abi_minor == DOPT_ABI_VERSION_MINOR + 1);
  CHECK(c.version == "1.1.0");
  REQUIRE(c.options.size() == 2);
  CHECK(c.options[0].name == "alpha");
  CHECK(c.options[0].type == DOPT_OPTION_INT);
  CHECK(c.options[0].default_value.value_or("") == "2");
  CHECK(c.options[0].max_value == 5);
  CHECK(c.options[1].name == "beta");
  CHECK(c.options[1].choices == std::vector<std::string>{"x", "y"});
  // The second component is found through the component array's stride too.
  CHECK(reg.get(DOPT_KIND_REDUCER, "mock_minor").description == "newer minor");
}

TEST_CASE("an ABI 1.1 plugin loads: its smaller structs, inclusive bounds, no job check") {
  PluginRegistry reg;
  REQUIRE(reg.load_file(mock("mock_v11")));
  CHECK(reg.skipped().empty());
  // Both components, and both options of each, are where the 1.1 layout put
  // them (walking them with this host's larger sizeof would misread all but
  // the first).
  const auto& r = reg.get(DOPT_KIND_REDUCER, "mock_v11");
  CHECK(r.abi_minor == 1);
  CHECK(r.description == "an ABI 1.1 reducer");
  REQUIRE(r.options.size() == 2);
  CHECK(r.options[0].name == "ratio");
  CHECK(r.options[0].min_value == 0);
  CHECK(r.options[0].max_value == 1);
  CHECK_FALSE(r.options[0].min_exclusive);  // 1.1 has no flags: bounds are inclusive
  CHECK_FALSE(r.options[0].max_exclusive);
  CHECK(r.options[0].range_text() == "[0, 1]");
  CHECK(r.options[1].name == "level");
  CHECK(r.options[1].default_value.value_or("") == "3");
  CHECK(r.traits == 0);
  CHECK((r.check_job == nullptr));
  const auto& a = reg.get(DOPT_KIND_ALGORITHM, "mock_v11");
  CHECK(a.description == "an ABI 1.1 algorithm");
  REQUIRE(a.options.size() == 2);
  CHECK(a.options[0].name == "stage");
  CHECK(a.options[1].name == "mode");
  CHECK(a.options[1].choices == std::vector<std::string>{"fast", "slow"});
  CHECK((a.check_job == nullptr));
}

namespace {

/// A rank-0-of-1 endpoint of a mock communicator (its create needs no store).
std::unique_ptr<distopt::Communicator> mock_comm(const distopt::ComponentInfo& info) {
  dopt_create_args a{};
  a.struct_size = sizeof a;
  a.rank = 0;
  a.world_size = 1;
  a.scope = "mock";
  return std::make_unique<distopt::Communicator>(info, a);
}

/// A 1-D float32 DLTensor on `type` whose data is never touched.
DLTensor tensor_on(DLDeviceType type, float* data, int64_t* shape) {
  DLTensor t = distopt::make_dltensor(data, 4, DLDataType{kDLFloat, 32, 1}, shape);
  t.device = DLDevice{type, 0};
  return t;
}

/// The message of the ComponentError `f` throws, after checking its status.
template <class F>
std::string refusal(F&& f, dopt_status want) {
  try {
    f();
  } catch (const distopt::ComponentError& e) {
    CHECK(e.status() == want);
    return e.what();
  }
  FAIL("no ComponentError thrown");
  return "";
}

}  // namespace

TEST_CASE("an ABI 1.3 plugin loads: host memory only, no streams, old vtable size") {
  PluginRegistry reg;
  REQUIRE(reg.load_file(mock("mock_v13")));
  const auto& c = reg.get(DOPT_KIND_COMMUNICATOR, "mock_v13");
  CHECK(c.abi_minor == 3);
  CHECK(c.devices == DOPT_DEVICES_DEFAULT);
  CHECK(c.description == "an ABI 1.3 communicator");
  // The second component is found through the 1.3 stride (no `devices`).
  const auto& r = reg.get(DOPT_KIND_REDUCER, "mock_v13");
  CHECK(r.description == "an ABI 1.3 reducer");
  CHECK(r.traits == DOPT_TRAIT_EXACT_MEAN);
  CHECK(r.devices == DOPT_DEVICES_DEFAULT);

  auto comm = mock_comm(c);
  std::string m = refusal([&] { comm->set_stream(nullptr); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("mock_v13: set_stream failed") != std::string::npos);
  CHECK(m.find("has no device streams") != std::string::npos);
  float data[4] = {};
  int64_t shape[1];
  DLTensor cuda = tensor_on(kDLCUDA, data, shape);
  m = refusal([&] { comm->allreduce(cuda, cuda, DOPT_REDUCE_SUM); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("mock_v13: allreduce failed (UNSUPPORTED)") != std::string::npos);
  CHECK(m.find("communicator 'mock_v13' does not accept kDLCUDA memory (it declares kDLCPU)") !=
        std::string::npos);
  // Host memory passes the rule and reaches the plugin (whose mock refuses
  // every data operation with its own message).
  DLTensor cpu = tensor_on(kDLCPU, data, shape);
  m = refusal([&] { comm->allreduce(cpu, cpu, DOPT_REDUCE_SUM); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("does not accept") == std::string::npos);
  // Pinned host memory is its own device type, refused unless declared.
  DLTensor pinned = tensor_on(kDLCUDAHost, data, shape);
  m = refusal([&] { comm->broadcast(pinned, 0); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("does not accept kDLCUDAHost memory") != std::string::npos);
}

TEST_CASE("ABI 1.4 devices are read and the host refuses memory a communicator lacks") {
  PluginRegistry reg;
  REQUIRE(reg.load_file(mock("mock_devices")));
  const auto& c = reg.get(DOPT_KIND_COMMUNICATOR, "mock_cuda");
  CHECK(c.abi_minor == DOPT_ABI_VERSION_MINOR);
  CHECK(c.devices == DOPT_DEVICE_BIT(kDLCUDA));
  CHECK(distopt::devices_text(c.devices) == "kDLCUDA");
  const auto& r = reg.get(DOPT_KIND_REDUCER, "mock_cuda");
  CHECK(r.devices == (DOPT_DEVICE_BIT(kDLCPU) | DOPT_DEVICE_BIT(kDLCUDA)));
  CHECK(distopt::devices_text(r.devices) == "kDLCPU, kDLCUDA");

  auto comm = mock_comm(c);
  float data[4] = {};
  int64_t s1[1], s2[1];
  DLTensor cpu = tensor_on(kDLCPU, data, s1);
  DLTensor cuda = tensor_on(kDLCUDA, data, s2);
  // A kDLCPU tensor next to a kDLCUDA one: the host names the CPU one.
  std::string m =
      refusal([&] { comm->reduce_scatter(cuda, cpu, DOPT_REDUCE_SUM); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("mock_cuda: reduce_scatter failed") != std::string::npos);
  CHECK(m.find("does not accept kDLCPU memory (it declares kDLCUDA)") != std::string::npos);
  m = refusal([&] { comm->send(cpu, 0, 0); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("does not accept kDLCPU memory") != std::string::npos);
  // The accepted device reaches the plugin.
  m = refusal([&] { comm->allgather(cuda, cuda); }, DOPT_ERR_UNSUPPORTED);
  CHECK(m.find("does not accept") == std::string::npos);
}

TEST_CASE("ABI 1.2 fields are read: option flags, traits, check_job") {
  PluginRegistry reg;
  REQUIRE(reg.load_file(mock("mock")));
  const auto& r = reg.get(DOPT_KIND_REDUCER, "mock");
  CHECK(r.abi_minor == DOPT_ABI_VERSION_MINOR);
  CHECK(r.traits == DOPT_TRAIT_EXACT_MEAN);
  CHECK((r.check_job == nullptr));
  REQUIRE(r.options.size() == 4);
  CHECK(r.options[1].name == "ratio");
  CHECK(r.options[1].min_exclusive);
  CHECK_FALSE(r.options[1].max_exclusive);
  CHECK(r.options[1].range_text() == "(0, 1]");
  CHECK_FALSE(r.options[1].in_range(0));
  CHECK(r.options[1].in_range(1));
  CHECK(r.options[0].range_text() == "[0, 10]");
  CHECK((reg.get(DOPT_KIND_ALGORITHM, "mock").check_job != nullptr));
  CHECK((reg.get(DOPT_KIND_ALGORITHM, "mock_req").check_job != nullptr));
  CHECK((reg.get(DOPT_KIND_COMMUNICATOR, "mock").check_job == nullptr));
  CHECK(reg.get(DOPT_KIND_COMMUNICATOR, "mock").traits == 0);
}

TEST_CASE("component metadata and option schemas are copied from the plugin") {
  PluginRegistry reg;
  REQUIRE(reg.load_file(mock("mock")));
  CHECK(reg.skipped().empty());
  const auto& r = reg.get(DOPT_KIND_REDUCER, "mock");
  CHECK(r.plugin_name == "mock");
  CHECK(r.plugin_version == "0.1.0");
  CHECK(r.version == "0.1.0");
  REQUIRE(r.options.size() == 4);
  CHECK(r.options[0].name == "level");
  CHECK(r.options[0].min_value == 0);
  CHECK(r.options[0].max_value == 10);
  CHECK(r.options[2].choices == std::vector<std::string>{"fast", "slow"});
  CHECK(r.options[3].type == DOPT_OPTION_BOOL);
  const auto& req = reg.get(DOPT_KIND_ALGORITHM, "mock_req");
  REQUIRE(req.options.size() == 1);
  CHECK_FALSE(req.options[0].default_value.has_value());
}

TEST_CASE("get() on an unavailable name says why") {
  PluginRegistry reg;
  reg.discover({kMockDir});
  auto message = [&](dopt_component_kind k, const std::string& name) {
    try {
      reg.get(k, name);
    } catch (const PluginError& e) {
      return std::string(e.what());
    }
    return std::string("(no exception)");
  };
  std::string m = message(DOPT_KIND_COMMUNICATOR, "mock_nullfn");
  CAPTURE(m);
  CHECK(m.find("no communicator named 'mock_nullfn'") != std::string::npos);
  CHECK(m.find("available communicators: mock, mock_cuda, mock_minor, mock_v13") !=
        std::string::npos);
  CHECK(m.find("'mock_nullfn' is unavailable because " + mock("mock_nullfn") + " was skipped") !=
        std::string::npos);
  CHECK(m.find("vtable field 'allreduce' is NULL") != std::string::npos);

  m = message(DOPT_KIND_COMMUNICATOR, "mock_badmajor");
  CAPTURE(m);
  CHECK(m.find("'mock_badmajor' is unavailable because " + mock("mock_badmajor")) !=
        std::string::npos);
  CHECK(m.find("ABI 2.0") != std::string::npos);

  // An unrelated name still lists every skipped library and its reason.
  m = message(DOPT_KIND_ALGORITHM, "nosuch");
  CAPTURE(m);
  CHECK(m.find("available algorithms: mock, mock_req") != std::string::npos);
  CHECK(m.find(mock("junk") + ": cannot be loaded") != std::string::npos);
  CHECK(m.find(mock("mock_noentry")) != std::string::npos);
}

TEST_CASE("components keep their library loaded after the registry is gone") {
  const std::string file = mock("mock");
  std::optional<distopt::ComponentInfo> comm;
  {
    PluginRegistry reg;
    REQUIRE(reg.load_file(file));
    comm = reg.get(DOPT_KIND_COMMUNICATOR, "mock");
  }
  REQUIRE(library_mapped(file));
  const auto* vt = static_cast<const dopt_communicator_v1*>(comm->vtable);
  dopt_create_args args{};
  args.struct_size = DOPT_CREATE_ARGS_STRUCT_SIZE;
  args.rank = 3;
  args.world_size = 5;
  dopt_comm* c = nullptr;
  REQUIRE(vt->create(&args, &c) == DOPT_OK);
  CHECK(vt->rank(c) == 3);
  CHECK(vt->world_size(c) == 5);
  CHECK(vt->destroy(c) == DOPT_OK);
  // The last reference unloads it (the refcount is real, not a leak).
  comm.reset();
  CHECK_FALSE(library_mapped(file));
}

TEST_CASE("the same file reached twice loads once; a copy elsewhere is a duplicate") {
  TempDir tmp;
  distopt::test::copy_file(mock("mock"), tmp.path + "/libdistopt_copy.so");
  std::ofstream(tmp.path + "/README.txt") << "not a plugin, and not named .so: ignored\n";
  REQUIRE(::symlink(mock("mock").c_str(), (tmp.path + "/libdistopt_link.so").c_str()) == 0);

  PluginRegistry reg;
  CHECK(reg.load_file(mock("mock")));
  CHECK(reg.load_file(mock("mock")));  // again: no duplicate of itself
  reg.discover({tmp.path, tmp.path + "/missing"});
  CHECK(reg.components().size() == 4);
  REQUIRE(reg.skipped().size() == 1);  // the copy; the symlink is the same file
  const auto& s = reg.skipped()[0];
  CHECK(s.file == tmp.path + "/libdistopt_copy.so");
  CHECK(s.reason.find("duplicate communicator 'mock': already provided by " + mock("mock")) !=
        std::string::npos);
}

TEST_CASE("load_file of a missing file is skipped naming it") {
  PluginRegistry reg;
  CHECK_FALSE(reg.load_file(kMockDir + "/libdistopt_nosuch.so"));
  REQUIRE(reg.skipped().size() == 1);
  CHECK(reg.skipped()[0].file == kMockDir + "/libdistopt_nosuch.so");
  CHECK(reg.skipped()[0].reason.find("cannot be loaded") != std::string::npos);
  CHECK_THROWS_AS(reg.get(DOPT_KIND_COMMUNICATOR, "mock"), PluginError);
}

TEST_CASE(
    "search_path: -P, config paths, $DISTOPT_PLUGIN_PATH, the build tree, the core's libdir, the "
    "install dir") {
  const char* old = std::getenv("DISTOPT_PLUGIN_PATH");
  std::string saved = old ? old : "";
  setenv("DISTOPT_PLUGIN_PATH", "/env/a::/env/b:/cfg/one", 1);
  auto p = PluginRegistry::search_path({"/cli/x"}, {"/cfg/one", "/cfg/two"});
  REQUIRE(p.size() == 8);
  CHECK(p[0] == "/cli/x");
  CHECK(p[1] == "/cfg/one");
  CHECK(p[2] == "/cfg/two");
  CHECK(p[3] == "/env/a");
  CHECK(p[4] == "/env/b");  // "/cfg/one" again is not repeated
  // This test runs on the build tree's libdistopt_core: its plugins/ next.
  CHECK(p[5] == DISTOPT_BUILD_PLUGIN_DIR_FOR_TEST);
  // <dir of libdistopt_core.so>/distopt/plugins: here, build/lib/distopt/plugins.
  CHECK(p[6].find("libdistopt_core") == std::string::npos);
  CHECK(p[6].size() > std::string("/distopt/plugins").size());
  CHECK(p[6].substr(p[6].size() - std::string("/distopt/plugins").size()) == "/distopt/plugins");
  CHECK(p[7] == DISTOPT_INSTALL_PLUGIN_DIR_FOR_TEST);
  unsetenv("DISTOPT_PLUGIN_PATH");
  CHECK(PluginRegistry::search_path({}).size() == 3);
  CHECK(PluginRegistry::search_path({"/cli/x"}, {}).front() == "/cli/x");
  if (old) setenv("DISTOPT_PLUGIN_PATH", saved.c_str(), 1);
}

TEST_CASE("the project's own plugins in build/plugins load cleanly (when built)") {
  const std::string dir = distopt::test::env_path("DISTOPT_PLUGIN_DIR");
  if (dir.empty() || !distopt::test::is_dir(dir)) {
    MESSAGE("no build/plugins directory yet; nothing to check");
    return;
  }
  PluginRegistry reg;
  reg.discover({dir});
  for (const auto& s : reg.skipped()) {
    CAPTURE(s.file);
    CAPTURE(s.reason);
    CHECK_MESSAGE(false, "a project plugin was skipped");
  }
  for (const auto& c : reg.components()) {
    CAPTURE(c.name);
    CHECK(c.abi_major == DOPT_ABI_VERSION_MAJOR);
    CHECK(c.abi_minor == DOPT_ABI_VERSION_MINOR);  // built with this tree's headers
    CHECK(c.vtable != nullptr);
    // No schema keeps the pre-1.2 trick of DBL_MIN for "greater than 0".
    for (const auto& o : c.options) {
      CAPTURE(o.name);
      CHECK(o.min_value != std::numeric_limits<double>::min());
    }
  }
}
