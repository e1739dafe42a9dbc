// Job YAML parsing and validation: the broken-input corpus (tests/config/bad,
// each file states the line and message it must produce), good configs, the
// Options schema checks, and the `distopt check` / `distopt plugins` CLI run
// as real processes. Plugin schemas come from the mock plugins of
// tests/registry (built into a test-only directory).
#include "distopt/config.hpp"

#include <doctest/doctest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstring>  // multiproc.hpp uses strdup without including it
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/component_options.hpp"
#include "distopt/error.hpp"
#include "distopt/registry.hpp"
#include "distopt/sdk/base/options.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"

using distopt::ConfigError;
using distopt::Options;
using distopt::OptionSpec;

namespace {

const std::string kMockDir = DISTOPT_MOCK_PLUGIN_DIR;
const std::string kTestDir = DISTOPT_CONFIG_TEST_DIR;

bool is_yaml(const std::string& name) {
  return name.size() > 5 && name.compare(name.size() - 5, 5, ".yaml") == 0;
}

// `target` relative to `base` (both absolute, no "." or ".." in them), as
// std::filesystem::relative gives it.
std::string relative_to(const std::string& target, const std::string& base) {
  auto split = [](const std::string& p) {
    std::vector<std::string> out;
    std::istringstream is(p);
    for (std::string e; std::getline(is, e, '/');)
      if (!e.empty()) out.push_back(e);
    return out;
  };
  const auto t = split(target), b = split(base);
  size_t common = 0;
  while (common < t.size() && common < b.size() && t[common] == b[common]) ++common;
  std::string rel;
  for (size_t i = common; i < b.size(); ++i) rel += "../";
  for (size_t i = common; i < t.size(); ++i) rel += t[i] + "/";
  if (rel.empty()) return ".";
  rel.pop_back();
  return rel;
}

struct BadCase {
  std::string file;
  int line = 0, col = 0;
  std::string expect;
};

std::vector<BadCase> bad_corpus(const std::string& dir = kTestDir + "/bad") {
  std::vector<BadCase> out;
  for (const std::string& name : distopt::test::list_dir(dir)) {
    if (!is_yaml(name)) continue;
    BadCase c;
    c.file = dir + "/" + name;
    std::ifstream in(c.file);
    std::string l;
    while (std::getline(in, l) && l.rfind("#", 0) == 0) {
      if (l.rfind("# expect-line: ", 0) == 0) c.line = std::stoi(l.substr(15));
      if (l.rfind("# expect-col: ", 0) == 0) c.col = std::stoi(l.substr(14));
      if (l.rfind("# expect: ", 0) == 0) c.expect = l.substr(10);
    }
    out.push_back(c);
  }
  std::sort(out.begin(), out.end(),
            [](const BadCase& a, const BadCase& b) { return a.file < b.file; });
  return out;
}

const distopt::PluginRegistry& mock_registry() {
  static distopt::PluginRegistry reg = [] {
    distopt::PluginRegistry r;
    r.discover({kMockDir});
    return r;
  }();
  return reg;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// The CLI, hermetic: no plugin path from the caller's environment, no log noise.
distopt::test::ProcResult cli(std::vector<std::string> args) {
  args.insert(args.begin(), distopt::test::env_path("DISTOPT_CLI"));
  return distopt::test::run_command(args, {"DISTOPT_PLUGIN_PATH=", "DISTOPT_LOG_LEVEL=error"});
}

std::string location(const BadCase& c) {
  return c.file + ":" + std::to_string(c.line) + ":" + (c.col ? std::to_string(c.col) + ":" : "");
}

}  // namespace

TEST_CASE("the broken-YAML corpus: each file gives a ConfigError at the right file:line") {
  auto corpus = bad_corpus();
  REQUIRE(corpus.size() >= 20);
  for (const auto& c : corpus) {
    CAPTURE(c.file);
    REQUIRE(c.line > 0);
    REQUIRE(!c.expect.empty());
    std::string msg = error_of([&] {
      auto cfg = distopt::load_job_config(c.file);
      distopt::validate_job(cfg, mock_registry());
    });
    CAPTURE(msg);
    CHECK(msg.rfind(location(c), 0) == 0);
    CHECK(msg.find(c.expect) != std::string::npos);
  }
}

TEST_CASE("distopt check exits 1 on every broken file and prints file:line") {
  for (const auto& c : bad_corpus()) {
    CAPTURE(c.file);
    auto r = cli({"check", c.file, "--plugin-path", kMockDir});
    CAPTURE(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(location(c)) != std::string::npos);
    // The part before any list of available names (the install dir may add some).
    CHECK(r.output.find(c.expect.substr(0, c.expect.find(';'))) != std::string::npos);
    CHECK(r.output.find(": OK (") == std::string::npos);
  }
}

TEST_CASE("a full good config parses with the expected values") {
  const std::string file = kTestDir + "/good/full.yaml";
  auto cfg = distopt::load_job_config(file);
  CHECK(cfg.path == file);
  REQUIRE(cfg.plugin_paths.size() == 2);
  // Relative plugin paths resolve against the YAML file's directory.
  CHECK(cfg.plugin_paths[0] == kTestDir + "/");  // good/.. (lexically normal keeps the slash)
  CHECK(cfg.plugin_paths[1] == "/");
  REQUIRE(cfg.plugin_dirs.size() == 2);
  CHECK(cfg.plugin_dirs[0].written == "..");
  CHECK(cfg.plugin_dirs[0].mark.line == 2);
  CHECK(cfg.world_size == 3);
  CHECK(cfg.rendezvous == "file:///tmp/distopt-rdzv");
  CHECK(cfg.timeout_s == doctest::Approx(12.5));
  CHECK(cfg.communicator.name == "mock");
  CHECK(cfg.reducer.name == "mock");
  CHECK(cfg.algorithm.name == "mock");
  CHECK(cfg.reducer.mark.line == 8);  // 0-based: `reducer:` is on line 9
  CHECK(cfg.optimizer_name == "adam");
  CHECK(cfg.train.model == "cnn");
  CHECK(cfg.train.dataset == "fashion-mnist");
  CHECK(cfg.train.data_dir == "/usr/share/datasets/fashion-mnist");
  CHECK(cfg.train.epochs == 3);
  CHECK(cfg.train.batch_size == 64);
  CHECK(cfg.train.seed == 42);
  CHECK(cfg.train.threads == 1);
  CHECK(cfg.train.log_every == 5);
  CHECK(cfg.train.max_steps == 10);

  auto v = distopt::validate_job(cfg, mock_registry());
  CHECK(v.communicator.values().empty());
  CHECK(v.reducer.get_int("level") == 7);
  CHECK(v.reducer.get_double("ratio") == doctest::Approx(0.5));  // default
  CHECK(v.reducer.get_string("mode") == "slow");
  CHECK(v.reducer.get_bool("verbose") == false);
  CHECK(v.reducer.get_double("bucket_cap_mb") == doctest::Approx(4.0));
  CHECK(v.reducer.get_int("align_bytes") == 64);
  CHECK(v.reducer.get_bool("overlap") == false);
  CHECK(v.algorithm.get_int("stage") == 1);
  CHECK(v.optimizer.get_double("lr") == doctest::Approx(0.01));
  CHECK(v.optimizer.get_double("beta1") == doctest::Approx(0.8));
  CHECK(v.optimizer.get_double("beta2") == doctest::Approx(0.999));
  CHECK(v.optimizer.get_bool("amsgrad") == true);
  CHECK_FALSE(v.optimizer.has("name"));
}

TEST_CASE("defaults: an empty job, and sections left out") {
  auto cfg = distopt::parse_job_config("");
  CHECK(cfg.path == "<string>");
  CHECK(cfg.world_size == 1);
  CHECK(cfg.rendezvous == "tcp://127.0.0.1:29500");
  CHECK(cfg.timeout_s == 60);
  CHECK(cfg.communicator.name == "tcp");
  CHECK(cfg.reducer.name == "mean");
  CHECK(cfg.algorithm.name == "allreduce");
  CHECK(cfg.optimizer_name == "sgd");
  CHECK(cfg.train.model == "mlp");
  CHECK(cfg.train.batch_size == 256);

  cfg = distopt::parse_job_config(
      "world: {size: 4}\nplugins: {paths: rel/dir}\nreducer: {name: mock}\n"
      "communicator: {name: mock}\nalgorithm: {name: mock}\n");
  CHECK(cfg.world_size == 4);
  REQUIRE(cfg.plugin_paths.size() == 1);
  CHECK(cfg.plugin_paths[0] == "rel/dir");  // no file: kept as written
  // Bucketing options default when the reducer has no options at all.
  auto v = distopt::validate_job(cfg, mock_registry());
  CHECK(v.reducer.get_double("bucket_cap_mb") == 25);
  CHECK(v.reducer.get_int("align_bytes") == 8);
  CHECK(v.reducer.get_bool("overlap") == true);
  CHECK(v.reducer.get_int("level") == 3);
  CHECK(v.optimizer.get_double("lr") == doctest::Approx(0.01));
}

TEST_CASE("a component or the optimizer may be given by its name alone") {
  auto cfg = distopt::parse_job_config(
      "communicator: mock\nreducer: mock\nalgorithm: mock\noptimizer: adam\n"
      "schedule: [{until_epoch: 1, algorithm: mock}, {reducer: mock}]\n");
  CHECK(cfg.communicator.name == "mock");
  CHECK(cfg.reducer.name == "mock");
  CHECK(cfg.algorithm.name == "mock");
  CHECK(cfg.optimizer_name == "adam");
  REQUIRE(cfg.schedule.size() == 2);
  CHECK(cfg.schedule[0].algorithm.name == "mock");
  auto v = distopt::validate_job(cfg, mock_registry());
  CHECK(v.reducer.get_double("bucket_cap_mb") == 25);  // defaults, as for {name: mock}
  CHECK(v.optimizer.get_double("beta1") == doctest::Approx(0.9));
  std::string m = error_of([] { distopt::parse_job_config("algorithm: [zero]\n", "j.yaml"); });
  CHECK(m.rfind("j.yaml:1:12: algorithm: expected a map, got a list", 0) == 0);
  m = error_of([] { distopt::parse_job_config("optimizer: nadam\n", "j.yaml"); });
  CHECK(m.find("optimizer.name: unknown optimizer 'nadam'") != std::string::npos);
}

TEST_CASE("errors from text use the given name, and a missing file is named") {
  std::string m = error_of([] { distopt::parse_job_config("world: {size: x}\n", "inline.yaml"); });
  CHECK(m.rfind("inline.yaml:1:15: world.size: expected an integer, got 'x'", 0) == 0);
  m = error_of([] { distopt::parse_job_config("world:\n  size: [1\n"); });
  CHECK(m.rfind("<string>:", 0) == 0);
  CHECK(m.find("YAML syntax error") != std::string::npos);
  m = error_of([] { distopt::load_job_config("/nonexistent/dir/job.yaml"); });
  CHECK(m.rfind("/nonexistent/dir/job.yaml: cannot read the job file", 0) == 0);
}

TEST_CASE("train.device: cpu, cuda, cuda:N; a GPU device needs CUDA, refused at its line") {
  CHECK(distopt::parse_job_config("train: {epochs: 1}\n").train.device == "cpu");
  CHECK(distopt::parse_job_config("train: {device: cpu}\n").train.device == "cpu");
  std::string m = error_of([] { distopt::parse_job_config("train:\n  device: gpu\n", "d.yaml"); });
  CHECK(m.rfind("d.yaml:2:11: train.device: 'gpu' is not one of cpu|cuda|cuda:N", 0) == 0);
  m = error_of([] { distopt::parse_job_config("train: {device: 'cuda:x'}\n", "d.yaml"); });
  CHECK(m.find("'cuda:x' is not one of") != std::string::npos);
  for (const char* dev : {"cuda", "cuda:0"}) {
    CAPTURE(dev);
    const std::string text = std::string("train:\n  device: '") + dev + "'\n";
    m = error_of([&] { distopt::parse_job_config(text, "d.yaml"); });
    if (torch::cuda::is_available()) {
      CHECK(m == "(no ConfigError)");
    } else {  // this machine: a CPU-only libtorch, or no GPU
      CHECK(m.rfind("d.yaml:2:11: train.device:", 0) == 0);
      CHECK(m.find("torch::cuda::is_available() is false") != std::string::npos);
    }
  }
}

TEST_CASE("validate_job: unknown names list what is available, at the name's line") {
  auto cfg = distopt::parse_job_config(
      "communicator: {name: mock}\nreducer: {name: mock}\nalgorithm:\n  name: zero\n", "job.yaml");
  std::string m = error_of([&] { distopt::validate_job(cfg, mock_registry()); });
  CAPTURE(m);
  CHECK(m.rfind("job.yaml:4:9: algorithm.name: no algorithm named 'zero' is available; available "
                "algorithms: mock, "
                "mock_req",
                0) == 0);
  CHECK(m.find("libdistopt_junk.so: cannot be loaded") != std::string::npos);
  // An empty registry says so and suggests where plugins come from.
  distopt::PluginRegistry empty;
  m = error_of([&] { distopt::validate_job(distopt::parse_job_config(""), empty); });
  CHECK(m.find("communicator (not set in the file; the default is 'tcp'): no communicator named "
               "'tcp'") != std::string::npos);
  CHECK(m.find("no plugin libraries were found") != std::string::npos);
}

TEST_CASE("Options::validate: types, ranges, choices, defaults, getters") {
  std::vector<OptionSpec> schema(5);
  schema[0] = {"n", DOPT_OPTION_INT, std::string("4"), 1, 8, {}, "an int"};
  schema[1] = {"x", DOPT_OPTION_DOUBLE, std::string("0.5"), 0, 1, {}, "a double"};
  schema[2] = {"b", DOPT_OPTION_BOOL, std::string("true"), 0, -1, {}, "a bool"};
  schema[3] = {"s", DOPT_OPTION_STRING, std::string("a"), 0, -1, {"a", "b"}, "a choice"};
  schema[4] = {"free", DOPT_OPTION_STRING, std::nullopt, 0, -1, {}, "required"};

  auto o = Options::validate(YAML::Load("{n: 8, x: 1, b: no, s: b, free: anything}"), schema,
                             "f.yaml", "sec");
  CHECK(o.get_int("n") == 8);
  CHECK(o.get_double("n") == 8.0);  // an INT reads as a double too
  CHECK(o.get_double("x") == 1.0);
  CHECK(o.get_bool("b") == false);
  CHECK(o.get_string("s") == "b");
  CHECK(o.get_string("free") == "anything");
  CHECK(Options::from_c(o.c_handle()) == &o);
  CHECK_THROWS_AS(o.get_bool("n"), ConfigError);
  CHECK_THROWS_AS(o.get_int("x"), ConfigError);
  CHECK_THROWS_AS(o.get_string("missing"), ConfigError);

  auto d = Options::validate(YAML::Load("{free: z}"), schema, "f.yaml", "sec");
  CHECK(d.get_int("n") == 4);
  CHECK(d.get_double("x") == 0.5);
  CHECK(d.get_bool("b") == true);
  CHECK(d.get_string("s") == "a");

  auto err = [&](const char* yaml) {
    return error_of([&] { Options::validate(YAML::Load(yaml), schema, "f.yaml", "sec"); });
  };
  CHECK(err("{free: z, n: 9}").rfind("f.yaml:1:14: sec.n: value 9 is out of range [1, 8]", 0) == 0);
  CHECK(Options::validate(YAML::Load("{free: z, n: 08}"), schema, "f", "sec").get_int("n") ==
        8);  // decimal, not octal
  CHECK(Options::validate(YAML::Load("{free: z, n: +2, x: 1e-1}"), schema, "f", "sec")
            .get_double("x") == 0.1);
  CHECK(err("{free: z, n: 0x4}").find("sec.n: expected an integer, got '0x4'") !=
        std::string::npos);
  CHECK(err("{free: z, n: 99999999999999999999}").find("expected an integer") != std::string::npos);
  CHECK(err("{free: z, n: 1.5}").find("sec.n: expected an integer, got '1.5'") !=
        std::string::npos);
  CHECK(err("{free: z, x: .nan}").find("sec.x: expected a number") != std::string::npos);
  CHECK(err("{free: z, x: -0.1}").find("out of range [0, 1]") != std::string::npos);
  CHECK(err("{free: z, b: maybe}").find("sec.b: expected a bool") != std::string::npos);
  CHECK(err("{free: z, s: c}").find("sec.s: 'c' is not one of a|b") != std::string::npos);
  CHECK(err("{free: [1]}").find("sec.free: expected a string, got a list") != std::string::npos);
  CHECK(err("{n: 2}").find("sec: missing required option 'free'") != std::string::npos);
  CHECK(err("{free: z, nn: 2}")
            .find("unknown key 'nn' in sec; valid keys: n, x, b, s, free (did you mean 'n'?)") !=
        std::string::npos);
  CHECK(err("[1, 2]").find("sec: expected a map of options, got a list") != std::string::npos);
  CHECK(err("{free: z, free: y}").find("duplicate key 'free'") != std::string::npos);
}

TEST_CASE("specs_from_c reads only the fields struct_size covers") {
  dopt_option_spec specs[3] = {
      {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "full", DOPT_OPTION_STRING, "a", 0, -1, "a|b",
       "help text", 0},
      // The 1.1 size: `flags` is not read (bounds stay inclusive).
      {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "n", DOPT_OPTION_INT, nullptr, 2, 3, nullptr, nullptr,
       DOPT_OPTION_MIN_EXCLUSIVE},
      // The 1.2 size: it is.
      {DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE, nullptr, "x", DOPT_OPTION_DOUBLE, "0.5", 0, 1, nullptr,
       nullptr, DOPT_OPTION_MIN_EXCLUSIVE | DOPT_OPTION_MAX_EXCLUSIVE},
  };
  auto v = distopt::specs_from_c(specs, 3);
  REQUIRE(v.size() == 3);
  CHECK(v[0].choices == std::vector<std::string>{"a", "b"});
  CHECK(v[0].help == "help text");
  CHECK_FALSE(v[1].default_value.has_value());
  CHECK(v[1].min_value == 2);
  CHECK(v[1].max_value == 3);
  CHECK_FALSE(v[1].min_exclusive);
  CHECK(v[1].range_text() == "[2, 3]");
  CHECK(v[2].min_exclusive);
  CHECK(v[2].max_exclusive);
  CHECK(v[2].range_text() == "(0, 1)");

  // A struct_size ending before `choices` hides choices and help.
  dopt_option_spec shortspec = specs[0];
  shortspec.struct_size = DOPT_STRUCT_SIZE_UPTO(dopt_option_spec, max_value);
  auto s = distopt::specs_from_c(&shortspec, 1);
  REQUIRE(s.size() == 1);
  CHECK(s[0].name == "full");
  CHECK(s[0].choices.empty());
  CHECK(s[0].help.empty());
}

TEST_CASE("bucket and optimizer option schemas") {
  const auto& b = distopt::bucket_option_specs();
  REQUIRE(b.size() == 3);
  CHECK(b[0].name == "bucket_cap_mb");
  CHECK(b[0].type == DOPT_OPTION_DOUBLE);
  CHECK(b[0].default_value.value_or("") == "25");
  CHECK(b[1].name == "align_bytes");
  CHECK(b[1].default_value.value_or("") == "8");
  CHECK(b[2].name == "overlap");
  CHECK(b[2].type == DOPT_OPTION_BOOL);

  for (const char* n : {"sgd", "adam", "adamw", "adagrad", "rmsprop"}) {
    CAPTURE(n);
    const std::string name = n;  // a named argument: g++ 14 -Wdangling-reference
    const auto& s = distopt::optimizer_option_specs(name);
    REQUIRE(!s.empty());
    CHECK(s[0].name == "lr");
  }
  CHECK(distopt::optimizer_option_specs("adam")[0].default_value.value_or("") == "0.001");
  CHECK_THROWS_AS(distopt::optimizer_option_specs("lbfgs"), ConfigError);
}

TEST_CASE("distopt check accepts good configs and prints the summary") {
  const std::string full = kTestDir + "/good/full.yaml";
  auto r = cli({"check", full, "--plugin-path", kMockDir});
  CAPTURE(r.output);
  CHECK(r.exit_code == 0);
  CHECK(
      r.output.find(
          full +
          ": OK (communicator mock, reducer mock, algorithm mock, optimizer adam, world size 3)") !=
      std::string::npos);

  const std::string req = kTestDir + "/good/required.yaml";
  r = cli({"check", req, "--plugin-path", kMockDir});
  CAPTURE(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("OK (communicator mock_minor, reducer mock, algorithm mock_req, optimizer "
                      "sgd, world size 1)") != std::string::npos);

  // The plugin dir can also come from $DISTOPT_PLUGIN_PATH.
  r = distopt::test::run_command({distopt::test::env_path("DISTOPT_CLI"), "check", req},
                                 {"DISTOPT_PLUGIN_PATH=" + kMockDir, "DISTOPT_LOG_LEVEL=error"});
  CHECK(r.exit_code == 0);
}

TEST_CASE("distopt check: usage errors") {
  auto r = cli({"check"});
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("missing JOB.yaml") != std::string::npos);
  r = cli({"check", "a.yaml", "--no-such-flag"});
  CHECK(r.exit_code == 2);
  r = cli({"check", "/nonexistent/job.yaml"});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("/nonexistent/job.yaml: cannot read the job file") != std::string::npos);
  // Without the mock plugins the default components are not found either.
  r = cli({"check", kTestDir + "/good/full.yaml"});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("full.yaml:8:22: communicator.name: no communicator named 'mock'") !=
        std::string::npos);
}

TEST_CASE("a plugins.paths entry that is not a directory is refused by check and train") {
  const std::string tmp = distopt::test::make_temp_dir("distopt-pdir");
  std::ofstream(tmp + "/file.txt") << "not a directory\n";
  const std::string mock = relative_to(kMockDir, tmp);
  // Line 3 names a missing directory, relative to the job file.
  std::ofstream(tmp + "/job.yaml")
      << "plugins:\n  paths:\n    - " << mock << "\n    - plugins-typo\n";
  auto r = cli({"check", tmp + "/job.yaml"});
  CAPTURE(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(tmp + "/job.yaml:4:7: plugins.paths: 'plugins-typo' (" + tmp +
                      "/plugins-typo) is not a plugin directory: No such file or directory") !=
        std::string::npos);
  // distopt train refuses it at the same line, before any rendezvous.
  r = distopt::test::run_command(
      {distopt::test::env_path("DISTOPT_CLI"), "train", tmp + "/job.yaml", "--max-steps", "1"},
      {"DISTOPT_LOG_LEVEL=error"});
  CAPTURE(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("job.yaml:4:7: plugins.paths: 'plugins-typo'") != std::string::npos);
  // A file is not a directory either; an existing directory passes.
  std::ofstream(tmp + "/job.yaml") << "plugins: {paths: [" << mock << ", file.txt]}\n";
  r = cli({"check", tmp + "/job.yaml"});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("plugins.paths: 'file.txt' (" + tmp +
                      "/file.txt) is not a plugin directory: not a directory") !=
        std::string::npos);
  std::ofstream(tmp + "/job.yaml") << "plugins: {paths: [" << mock << "]}\n";
  r = cli({"check", tmp + "/job.yaml"});
  CAPTURE(r.output);
  CHECK(r.exit_code == 0);
  distopt::test::remove_tree(tmp);
}

TEST_CASE("distopt plugins lists components, options and skipped files") {
  auto r = cli({"plugins", "--plugin-path", kMockDir});
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  // The mock directory's 8, besides the build tree's own plugins.
  CHECK(r.output.find("Components (") != std::string::npos);
  CHECK(r.output.find(kMockDir + "/libdistopt_mock.so") != std::string::npos);
  CHECK(r.output.find("compression level") != std::string::npos);
  CHECK(r.output.find("fast|slow") != std::string::npos);
  CHECK(r.output.find("(required)") != std::string::npos);
  CHECK(r.output.find("bucket_cap_mb") != std::string::npos);
  CHECK(r.output.find("Skipped (9)") != std::string::npos);
  CHECK(r.output.find(
            kMockDir +
            "/libdistopt_mock_nullfn.so: component 'mock_nullfn': communicator vtable field "
            "'allreduce' is NULL") != std::string::npos);

  r = cli({"plugins", "--plugin-path", kMockDir, "--json"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);  // nothing but JSON on stdout
  size_t mocks = 0;
  for (const auto& c : j["components"])
    mocks += c["file"].get<std::string>().rfind(kMockDir + "/", 0) == 0;
  REQUIRE(mocks == 12);  // mock 3, mock_req, mock_cuda 2, mock_minor 2, mock_v11 2, mock_v13 2
  REQUIRE(j["skipped"].size() == 9);
  bool found = false;
  for (const auto& c : j["components"]) {
    if (c["kind"] == "reducer" && c["name"] == "mock") {
      found = true;
      CHECK(c["abi"] ==
            std::to_string(DOPT_ABI_VERSION_MAJOR) + "." + std::to_string(DOPT_ABI_VERSION_MINOR));
      CHECK(c["file"] == kMockDir + "/libdistopt_mock.so");
      REQUIRE(c["options"].size() == 4);
      CHECK(c["options"][0]["name"] == "level");
      CHECK(c["options"][0]["type"] == "int");
      CHECK(c["options"][0]["default"] == "3");
      CHECK(c["options"][0]["range"][1] == "10");
      CHECK(c["options"][2]["choices"][1] == "slow");
    }
    if (c["name"] == "mock_minor")
      CHECK(c["abi"] == std::to_string(DOPT_ABI_VERSION_MAJOR) + "." +
                            std::to_string(DOPT_ABI_VERSION_MINOR + 1));
  }
  CHECK(found);
  for (const auto& s : j["skipped"]) {
    CHECK(s["file"].get<std::string>().rfind(kMockDir + "/", 0) == 0);
    CHECK(!s["reason"].get<std::string>().empty());
  }

  // --config uses the job's plugins.paths (relative to the job file).
  const std::string tmp = distopt::test::make_temp_dir("distopt-cfg");
  std::ofstream(tmp + "/job.yaml") << "plugins: {paths: [" << relative_to(kMockDir, tmp) << "]}\n";
  r = cli({"plugins", "--config", tmp + "/job.yaml", "--json"});
  distopt::test::remove_tree(tmp);
  REQUIRE(r.exit_code == 0);
  mocks = 0;
  const auto listed = nlohmann::json::parse(r.output);  // kept alive for the loop
  for (const auto& c : listed["components"])
    mocks += c["file"].get<std::string>().rfind(kMockDir + "/", 0) == 0;
  CHECK(mocks == 12);
}

TEST_CASE("distopt plugins prints ranges in interval notation, open bounds included") {
  auto r = cli({"plugins", "--plugin-path", kMockDir});
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("(0, 1]") != std::string::npos);            // mock's ratio (ABI 1.2 flags)
  CHECK(r.output.find("[0, 10]") != std::string::npos);           // mock's level
  CHECK(r.output.find("inclusive [0, 1]") != std::string::npos);  // mock_v11 (1.1): help text
  CHECK(r.output.find("(0, 1000000]") != std::string::npos);      // bucket_cap_mb
  CHECK(r.output.find("reduces to the exact mean") != std::string::npos);
  CHECK(r.output.find("checks the whole job") != std::string::npos);
  CHECK(r.output.find("2.2250738585072014e-308") == std::string::npos);

  r = cli({"plugins", "--plugin-path", kMockDir, "--json"});
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.output);
  int seen = 0;
  for (const auto& c : j["components"]) {
    if (c["kind"] == "reducer" && c["name"] == "mock") {
      ++seen;
      CHECK(c["traits"]["exact_mean"] == true);
      CHECK(c["checks_job"] == false);
      CHECK(c["options"][1]["name"] == "ratio");
      CHECK(c["options"][1]["interval"] == "(0, 1]");
      CHECK(c["options"][1]["min_exclusive"] == true);
      CHECK(c["options"][1]["max_exclusive"] == false);
      CHECK(c["options"][1]["range"][0] == "0");
    }
    if (c["kind"] == "reducer" && c["name"] == "mock_v11") {
      ++seen;
      CHECK(c["abi"] == "1.1");
      CHECK(c["traits"]["exact_mean"] == false);
      CHECK(c["options"][0]["interval"] == "[0, 1]");
    }
    if (c["kind"] == "algorithm" && c["name"] == "mock") {
      ++seen;
      CHECK(c["checks_job"] == true);
    }
  }
  CHECK(seen == 3);
}

TEST_CASE("an ABI 1.1 plugin's components load and check, with inclusive bounds") {
  const std::string file = kTestDir + "/good/abi11.yaml";
  auto cfg = distopt::load_job_config(file);
  auto v = distopt::validate_job(cfg, mock_registry());
  CHECK(v.reducer.get_double("ratio") == 0);  // [0, 1] in 1.1: 0 is allowed
  CHECK(v.reducer.get_int("level") == 10);
  CHECK(v.algorithm.get_int("stage") == 3);
  CHECK(v.algorithm.get_string("mode") == "slow");
  auto r = cli({"check", file, "--plugin-path", kMockDir});
  CAPTURE(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("OK (communicator mock, reducer mock_v11, algorithm mock_v11") !=
        std::string::npos);
}

TEST_CASE("job checks (ABI 1.2) see the whole job: accepted combinations pass") {
  // mock's check_job refuses only stage 3 with reducer mode 'slow'.
  auto ok = [&](const std::string& yaml) {
    auto cfg = distopt::parse_job_config(yaml, "job.yaml");
    CHECK_NOTHROW(distopt::validate_job(cfg, mock_registry()));
  };
  ok("communicator: {name: mock}\nreducer: {name: mock, options: {mode: fast}}\n"
     "algorithm: {name: mock, options: {stage: 3}}\n");
  ok("communicator: {name: mock}\nreducer: {name: mock, options: {mode: slow}}\n"
     "algorithm: {name: mock, options: {stage: 2}}\n");
  // mock_req refuses more than 4 ranks: it is told the world size given to
  // validate_job (Runtime's launcher count), else world.size.
  const std::string req =
      "communicator: {name: mock}\nreducer: {name: mock}\n"
      "algorithm: {name: mock_req, options: {target: x}}\n";
  auto cfg = distopt::parse_job_config("world: {size: 8}\n" + req, "job.yaml");
  CHECK_NOTHROW(distopt::validate_job(cfg, mock_registry(), 4));
  std::string m = error_of([&] { distopt::validate_job(cfg, mock_registry()); });
  CHECK(m.rfind("job.yaml:4:1: algorithm: algorithm 'mock_req' refuses this job: mock_req: at "
                "most 4 ranks",
                0) == 0);
  cfg = distopt::parse_job_config(req, "job.yaml");
  m = error_of([&] { distopt::validate_job(cfg, mock_registry(), 5); });
  CHECK(m.find("at most 4 ranks") != std::string::npos);
}

TEST_CASE("the SDK option builder makes ABI 1.2 specs") {
  namespace sdk = distopt::sdk;
  constexpr dopt_option_spec specs[] = {
      sdk::option_double("ratio", "0.01", "fraction").range_open_min(0, 1),
      sdk::option_double("decay", "0", "factor").range_open_max(0, 1),
      sdk::option_int("k", "1", "count").at_least(1),
      sdk::option_double("scale", "1", "positive").greater_than(0),
      sdk::option_double("t", "0.5", "open").range_open(0, 1),
      sdk::option_int("n", "2", "closed").range(1, 8),
      sdk::option_string("mode", "a", "choice").choices("a|b"),
      sdk::option_bool("on", "true", "flag"),
      sdk::option_string("target", nullptr, "required"),
  };
  static_assert(specs[0].struct_size == DOPT_OPTION_SPEC_V1_2_STRUCT_SIZE);
  static_assert(specs[0].flags == DOPT_OPTION_MIN_EXCLUSIVE);
  static_assert(specs[7].min_value > specs[7].max_value);  // a bool has no range
  auto v = distopt::specs_from_c(specs, sizeof specs / sizeof specs[0]);
  REQUIRE(v.size() == 9);
  CHECK(v[0].range_text() == "(0, 1]");
  CHECK(v[1].range_text() == "[0, 1)");
  CHECK(v[2].range_text() == "[1, inf)");
  CHECK(v[3].range_text() == "(0, inf)");
  CHECK(v[4].range_text() == "(0, 1)");
  CHECK(v[5].range_text() == "[1, 8]");
  CHECK(v[6].range_text().empty());
  CHECK(v[6].choices == std::vector<std::string>{"a", "b"});
  CHECK(v[7].range_text().empty());
  CHECK_FALSE(v[8].default_value.has_value());
  CHECK_FALSE(v[0].in_range(0));
  CHECK(v[0].in_range(1));
  CHECK_FALSE(v[1].in_range(1));
  CHECK_FALSE(v[3].in_range(std::numeric_limits<double>::infinity()));  // inf bounds are open

  auto err = [&](const char* yaml) {
    return error_of([&] { Options::validate(YAML::Load(yaml), v, "f.yaml", "sec"); });
  };
  CHECK(err("{target: x, ratio: 0}")
            .rfind("f.yaml:1:20: sec.ratio: value 0 is out of range (0, 1]", 0) == 0);
  CHECK(err("{target: x, decay: 1}").find("sec.decay: value 1 is out of range [0, 1)") !=
        std::string::npos);
  CHECK(err("{target: x, k: 0}").find("sec.k: value 0 is out of range [1, inf)") !=
        std::string::npos);
  CHECK(err("{target: x, scale: .inf}").find("out of range (0, inf)") != std::string::npos);
  auto o = Options::validate(YAML::Load("{target: x, ratio: 1, decay: 0, scale: 1e-300}"), v,
                             "f.yaml", "sec");
  CHECK(o.get_double("ratio") == 1);
}

TEST_CASE("the project's plugins: open bounds and job checks at distopt check time") {
  const std::string plugins = distopt::test::env_path("DISTOPT_PLUGIN_DIR");
  distopt::PluginRegistry reg;
  reg.discover({plugins});
  if (!reg.find(DOPT_KIND_COMMUNICATOR, "tcp") || !reg.find(DOPT_KIND_REDUCER, "mean") ||
      !reg.find(DOPT_KIND_REDUCER, "topk") || !reg.find(DOPT_KIND_ALGORITHM, "zero") ||
      !reg.find(DOPT_KIND_ALGORITHM, "allreduce")) {
    MESSAGE("the tcp/mean/compress/zero/allreduce plugins are not built here; nothing to check");
    return;
  }
  CHECK(reg.get(DOPT_KIND_REDUCER, "mean").traits == DOPT_TRAIT_EXACT_MEAN);
  CHECK(reg.get(DOPT_KIND_REDUCER, "topk").traits == 0);
  CHECK((reg.get(DOPT_KIND_ALGORITHM, "zero").check_job != nullptr));

  const auto corpus = bad_corpus(kTestDir + "/project/bad");
  REQUIRE(corpus.size() >= 5);
  for (const auto& c : corpus) {
    CAPTURE(c.file);
    REQUIRE(c.line > 0);
    REQUIRE(c.col > 0);
    std::string msg = error_of([&] {
      auto cfg = distopt::load_job_config(c.file);
      distopt::validate_job(cfg, reg);
    });
    CAPTURE(msg);
    CHECK(msg.rfind(location(c), 0) == 0);
    CHECK(msg.find(c.expect) != std::string::npos);
    auto r = cli({"check", c.file, "--plugin-path", plugins});
    CAPTURE(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find(location(c) + " " + c.expect) != std::string::npos);
  }
  for (const std::string& name : distopt::test::list_dir(kTestDir + "/project/good")) {
    const std::string file = kTestDir + "/project/good/" + name;
    CAPTURE(file);
    auto r = cli({"check", file, "--plugin-path", plugins});
    CAPTURE(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find(": OK (") != std::string::npos);
  }

  // `distopt plugins` says (0, 1] for topk's and randomk's ratio, [0, 1) for momentum.
  auto r = cli({"plugins", "--plugin-path", plugins, "--json"});
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.output);
  int seen = 0;
  for (const auto& comp : j["components"]) {
    if (comp["kind"] != "reducer" || (comp["name"] != "topk" && comp["name"] != "randomk"))
      continue;
    for (const auto& o : comp["options"]) {
      if (o["name"] == "ratio") seen += o["interval"] == "(0, 1]";
      if (o["name"] == "momentum") seen += o["interval"] == "[0, 1)";
    }
  }
  CHECK(seen == 4);
  r = cli({"plugins", "--plugin-path", plugins});
  CAPTURE(r.output);
  bool ratio_line = false;
  std::istringstream lines(r.output);
  for (std::string l; std::getline(lines, l);)
    ratio_line = ratio_line || (l.find(" ratio ") != std::string::npos &&
                                l.find(" (0, 1] ") != std::string::npos);
  CHECK(ratio_line);
}

TEST_CASE("the shipped example jobs pass distopt check against the project's plugins") {
  const std::string examples =
      distopt::test::env_path("DISTOPT_SOURCE_DIR") + "/share/distopt/examples";
  const std::string plugins = distopt::test::env_path("DISTOPT_PLUGIN_DIR");
  distopt::PluginRegistry reg;
  reg.discover({plugins});
  if (!distopt::test::is_dir(examples) || !reg.find(DOPT_KIND_COMMUNICATOR, "tcp") ||
      !reg.find(DOPT_KIND_REDUCER, "mean") || !reg.find(DOPT_KIND_ALGORITHM, "allreduce")) {
    MESSAGE("examples or the tcp/mean/allreduce plugins are not built here; nothing to check");
    return;
  }
  for (const std::string& name : distopt::test::list_dir(examples)) {
    if (!is_yaml(name)) continue;
    const std::string file = examples + "/" + name;
    CAPTURE(file);
    // An example for a plugin this build lacks (ucx without UCX, nccl
    // without CUDA) is checked where that plugin is built.
    const distopt::JobConfig job = distopt::load_job_config(file);
    if (!reg.find(DOPT_KIND_COMMUNICATOR, job.communicator.name)) {
      MESSAGE(file << ": communicator '" << job.communicator.name << "' not built here; skipped");
      continue;
    }
    auto r = cli({"check", file, "--plugin-path", plugins});
    CAPTURE(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find(": OK (") != std::string::npos);
  }
}

TEST_CASE("an empty job file is an error that says so; text may still be empty") {
  const std::string dir = distopt::test::make_temp_dir("distopt-empty");
  for (const char* body : {"", "\n\n", "# only a comment\n"}) {
    const std::string path = dir + "/job.yaml";
    std::ofstream(path) << body;
    try {
      distopt::load_job_config(path);
      FAIL("an empty job file was accepted");
    } catch (const distopt::ConfigError& e) {
      const std::string m = e.what();
      CHECK(m.find(path) != std::string::npos);
      CHECK(m.find("empty") != std::string::npos);
    }
  }
  distopt::test::remove_tree(dir);
  CHECK(distopt::parse_job_config("").world_size == 1);  // programmatic defaults
}

TEST_CASE("app: is the program's own section, any YAML, not validated") {
  auto cfg = distopt::parse_job_config(
      "world: {size: 2}\napp: {dataset: /data/x, layers: [64, 32], anything: {nested: true}}\n");
  REQUIRE(cfg.app.IsMap());
  CHECK(cfg.app["dataset"].as<std::string>() == "/data/x");
  CHECK(cfg.app["layers"][1].as<int>() == 32);
  CHECK(cfg.app["anything"]["nested"].as<bool>());
  CHECK(distopt::parse_job_config("world: {size: 2}\n").app.IsNull());  // absent: null
}

TEST_CASE("optimizer.grad_clip is refused for an algorithm without ABI 1.5 set_grad_clip") {
  // The mock algorithm's vtable is the ABI 1.0 one: it cannot clip.
  const std::string job =
      "communicator: {name: mock}\nreducer: {name: mock}\nalgorithm: {name: mock}\n"
      "optimizer:\n  name: sgd\n  grad_clip: ";
  CHECK_NOTHROW(
      distopt::validate_job(distopt::parse_job_config(job + "0\n", "job.yaml"), mock_registry()));
  auto cfg = distopt::parse_job_config(job + "0.5\n", "job.yaml");
  const std::string m = error_of([&] { distopt::validate_job(cfg, mock_registry()); });
  CHECK(m.rfind("job.yaml:6:3: optimizer.grad_clip: algorithm 'mock' (plugin ", 0) == 0);
  CHECK(m.find("libdistopt_mock.so") != std::string::npos);
  CHECK(m.find("cannot clip gradients") != std::string::npos);
}

TEST_CASE("mistakes in several sections are all reported, in file order") {
  const std::string yaml =
      "world: {size: 0}\n"
      "optimizer: {name: adam, betas: [0.9, 0.99]}\n"
      "train: {epochs: 2, log_evry: 5}\n";
  std::string msg;
  try {
    distopt::parse_job_config(yaml, "three.yaml");
  } catch (const distopt::ConfigError& e) {
    msg = e.what();
  }
  INFO(msg);
  const size_t world = msg.find("three.yaml:1:"), opt = msg.find("three.yaml:2:"),
               train = msg.find("three.yaml:3:");
  REQUIRE(world != std::string::npos);
  REQUIRE(opt != std::string::npos);
  REQUIRE(train != std::string::npos);
  CHECK(world < opt);
  CHECK(opt < train);
  CHECK(msg.find("world.size") != std::string::npos);
  CHECK(msg.find("did you mean 'beta1'?") != std::string::npos);
  CHECK(msg.find("did you mean 'log_every'?") != std::string::npos);
  CHECK(msg.find("(3 mistakes)") != std::string::npos);
  // One mistake: its message alone, as before.
  try {
    distopt::parse_job_config("world: {size: 0}\n", "one.yaml");
  } catch (const distopt::ConfigError& e) {
    msg = e.what();
  }
  CHECK(msg.rfind("one.yaml:1:", 0) == 0);
  CHECK(msg.find("mistakes") == std::string::npos);
}
