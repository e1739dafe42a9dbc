// Job configuration: parsing the YAML file (sections and their keys) and
// validating the selected components' options against the plugins' schemas.
#include "distopt/config.hpp"

#include <sys/stat.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/posix_fs.hpp"
#include "base/yaml_util.hpp"
#include "config/inner_component.hpp"
#include "config/job_check.hpp"
#include "config/key_range.hpp"
#include "config/lr_schedule_config.hpp"
#include "distopt/buckets.hpp"
#include "distopt/device_rule.hpp"
#include "distopt/error.hpp"
#include "distopt/key_schema.hpp"
#include "distopt/registry.hpp"
#include "distopt/sdk/optim/optimizer_schema.hpp"

namespace distopt {

const char* buffer_sync_name(BufferSync s) {
  switch (s) {
    case BufferSync::broadcast:
      return "broadcast";
    case BufferSync::average:
      return "average";
    case BufferSync::none:
      return "none";
  }
  return "?";
}

BufferSync parse_buffer_sync(const std::string& name) {
  for (BufferSync s : {BufferSync::broadcast, BufferSync::average, BufferSync::none})
    if (name == buffer_sync_name(s)) return s;
  throw ConfigError("unknown buffer synchronisation '" + name +
                    "' (valid: broadcast, average, none)");
}
namespace {

namespace pfs = util;
using namespace yaml;

/// node[key] when node is a map; an undefined node otherwise (never throws).
YAML::Node child(const YAML::Node& node, const char* key) {
  if (!node.IsDefined() || !node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  return node[key];
}

/// Where `key` itself is written in `map` (the line a user reads as the
/// section's start), or `fallback`.
YAML::Mark key_mark(const YAML::Node& map, const char* key, const YAML::Mark& fallback) {
  if (!map.IsDefined() || !map.IsMap()) return fallback;
  for (const auto& kv : map) {
    const YAML::Node k = kv.first;
    if (k.IsScalar() && k.Scalar() == key) return mark_of(k, fallback);
  }
  return fallback;
}

// `to` refers to what `from` does. yaml-cpp's Node::operator= writes
// through a node shared with other copies (so assigning a copied JobConfig's
// section would change the original's); reset() only rebinds.
void rebind(ComponentConfig& to, const ComponentConfig& from) {
  to.name = from.name;
  to.mark = from.mark;
  to.options.reset(from.options);
  to.node.reset(from.node);
  to.inner = from.inner;
}

class Parser {
 public:
  Parser(std::string file, std::string base_dir)
      : file_(std::move(file)), base_dir_(std::move(base_dir)) {}

  JobConfig parse(const YAML::Node& root) {
    JobConfig cfg;
    cfg.path = file_;
    cfg.root = root;
    if (!root.IsDefined() || root.IsNull()) return cfg;  // an empty file: every default
    if (!root.IsMap())
      fail(file_, mark_of(root),
           "expected a map of sections at the top level, got " + describe(root));
    // Every section is parsed even after a mistake in another, so one run
    // of `distopt check` reports a mistake per section, in file order.
    std::vector<std::string> mistakes;
    auto parse_section = [&mistakes](auto&& parse_it) {
      try {
        parse_it();
      } catch (const ConfigError& e) {
        mistakes.push_back(e.what());
      }
    };
    parse_section([&] { check_keys(root, "the top level", config_keys("the top level")); });
    // The program's own section: not validated here. (Assigning yaml-cpp's
    // invalid node for a missing key throws, hence the check.)
    if (YAML::Node app = child(root, "app"); app.IsDefined()) cfg.app = app;
    parse_section([&] { parse_plugins(section(root, "plugins"), cfg); });
    parse_section([&] { parse_world(section(root, "world"), cfg); });
    parse_section([&] { parse_component(root, "communicator", cfg.communicator); });
    parse_section([&] { parse_component(root, "control_communicator", cfg.control_communicator); });
    parse_section([&] { parse_component(root, "reducer", cfg.reducer); });
    parse_section([&] { parse_component(root, "algorithm", cfg.algorithm); });
    parse_section([&] { parse_optimizer(root, cfg); });
    parse_section([&] { parse_train(section(root, "train"), cfg.train); });
    parse_section([&] { parse_precision(root, cfg); });
    parse_section([&] { parse_buffers(section(root, "buffers"), cfg); });
    parse_section([&] { parse_join(section(root, "join"), cfg); });
    parse_section([&] { parse_elastic(section(root, "elastic"), cfg); });
    // The schedule refers to the components: only after they parsed.
    if (mistakes.empty()) parse_section([&] { parse_schedule(root, cfg); });
    parse_section([&] { parse_autotune(root, cfg); });
    if (mistakes.size() == 1) throw ConfigError(mistakes[0]);
    if (!mistakes.empty()) {
      std::string all = mistakes[0];
      for (size_t k = 1; k < mistakes.size(); ++k) all += "\n" + mistakes[k];
      throw ConfigError(all + "\n(" + std::to_string(mistakes.size()) + " mistakes)");
    }
    return cfg;
  }

 private:
  // A section must be a map; absent or empty (`world:`) means "all defaults".
  YAML::Node section(const YAML::Node& root, const char* name) {
    YAML::Node n = root[name];
    if (n.IsDefined() && !n.IsNull() && !n.IsMap())
      fail(file_, mark_of(n), std::string(name) + ": expected a map, got " + describe(n));
    return n;
  }

  void check_keys(const YAML::Node& map, const std::string& section,
                  const std::vector<std::string>& valid) {
    std::set<std::string> seen;
    for (const auto& kv : map) {
      const YAML::Node k = kv.first;
      const YAML::Mark m = mark_of(k, mark_of(map));
      if (!k.IsScalar()) fail(file_, m, section + ": keys must be strings, got " + describe(k));
      if (!seen.insert(k.Scalar()).second)
        fail(file_, m, section + ": duplicate key '" + k.Scalar() + "'");
      bool ok = false;
      for (const auto& v : valid) ok = ok || v == k.Scalar();
      if (!ok) fail(file_, m, unknown_key_message(k.Scalar(), section, valid));
    }
  }

  static constexpr int64_t kHuge = int64_t(1) << 40;  // "no upper bound" in messages

  // Typed getters of `map.key`, a key of section `section` in the key tables
  // (key_schema.cpp): a number's range and a name's choices come from its row
  // (config/key_range.hpp), the one place they are written. Absent keys keep
  // `out`. `path` names the key in messages ("world.size" by default; a
  // schedule phase's is "schedule[2].until_step").
  void get_int(const YAML::Node& map, const std::string& section, const char* key, int64_t& out,
               std::string path = "") {
    YAML::Node n = child(map, key);
    if (!n.IsDefined()) return;
    if (path.empty()) path = section + "." + key;
    const config::KeyRange r = config::key_range(config::config_key(section, key));
    auto v = to_int(n);
    if (!v) fail(file_, mark_of(n), path + ": expected an integer, got " + describe(n));
    if (*v < r.int_lo || *v > r.int_hi)
      fail(file_, mark_of(n),
           path + ": value " + std::to_string(*v) +
               (r.int_hi >= kHuge ? " must be >= " + std::to_string(r.int_lo)
                                  : " is out of range [" + std::to_string(r.int_lo) + ", " +
                                        std::to_string(r.int_hi) + "]"));
    out = *v;
  }
  void get_double(const YAML::Node& map, const std::string& section, const char* key, double& out) {
    YAML::Node n = child(map, key);
    if (!n.IsDefined()) return;
    const std::string path = section + "." + key, key_name = key;
    const KeySpec& spec = config::config_key(section, key_name);  // a table entry, not a temporary
    const config::KeyRange r = config::key_range(spec);
    auto v = to_double(n);
    if (!v) fail(file_, mark_of(n), path + ": expected a number, got " + describe(n));
    const bool ok = (r.lo_open ? *v > r.lo : *v >= r.lo) && (r.hi_open ? *v < r.hi : *v <= r.hi) &&
                    std::isfinite(*v);
    if (!ok)
      fail(file_, mark_of(n), path + ": value " + n.Scalar() + " is out of range " + spec.range);
    out = *v;
  }
  void get_bool(const YAML::Node& map, const std::string& section, const char* key, bool& out) {
    YAML::Node n = child(map, key);
    if (!n.IsDefined()) return;
    auto v = to_bool(n);
    if (!v)
      fail(file_, mark_of(n), section + "." + key + ": expected true or false, got " + describe(n));
    out = *v;
  }
  // Any string (a path, a URL: checked by the caller).
  void get_string(const YAML::Node& map, const std::string& section, const char* key,
                  std::string& out) {
    YAML::Node n = child(map, key);
    if (!n.IsDefined()) return;
    auto v = to_string(n);
    if (!v || n.IsNull())
      fail(file_, mark_of(n), section + "." + key + ": expected a string, got " + describe(n));
    out = *v;
  }
  // One of the names the key's row lists ("mlp|cnn|resnet").
  void get_choice(const YAML::Node& map, const std::string& section, const char* key,
                  std::string& out) {
    if (!child(map, key).IsDefined()) return;
    std::string v;
    get_string(map, section, key, v);
    const std::vector<std::string> choices =
        config::key_range(config::config_key(section, key)).choices;
    if (std::find(choices.begin(), choices.end(), v) == choices.end())
      fail(file_, mark_of(child(map, key)),
           section + "." + key + ": '" + v + "' is not one of " + join(choices, "|"));
    out = v;
  }

  std::string resolve(const std::string& p) const {
    if (base_dir_.empty() || p.empty() || pfs::is_absolute(p)) return p;
    return pfs::lexically_normal(pfs::join(base_dir_, p));
  }

  void parse_plugins(const YAML::Node& s, JobConfig& cfg) {
    if (!s.IsDefined() || s.IsNull()) return;
    check_keys(s, "plugins", config_keys("plugins"));
    YAML::Node paths = s["paths"];
    if (!paths.IsDefined() || paths.IsNull()) return;
    auto add = [&](const YAML::Node& p) {
      auto v = to_string(p);
      if (!v || v->empty())
        fail(file_, mark_of(p, mark_of(paths)),
             "plugins.paths: expected a directory name, got " + describe(p));
      cfg.plugin_paths.push_back(resolve(*v));
      cfg.plugin_dirs.push_back({*v, cfg.plugin_paths.back(), mark_of(p, mark_of(paths))});
    };
    if (paths.IsScalar()) {
      add(paths);
    } else if (paths.IsSequence()) {
      for (const auto& p : paths) add(p);
    } else {
      fail(file_, mark_of(paths),
           "plugins.paths: expected a list of directories, got " + describe(paths));
    }
  }

  void parse_world(const YAML::Node& s, JobConfig& cfg) {
    if (!s.IsDefined() || s.IsNull()) return;
    check_keys(s, "world", config_keys("world"));
    get_int(s, "world", "size", cfg.world_size);
    if (YAML::Node n = s["size"]; n.IsDefined() && !n.IsNull()) {
      cfg.world_size_set = true;
      cfg.world_size_mark = mark_of(n);
    }
    get_string(s, "world", "rendezvous", cfg.rendezvous);
    if (YAML::Node r = s["rendezvous"]; r.IsDefined()) check_rendezvous(cfg.rendezvous, mark_of(r));
    get_double(s, "world", "timeout_s", cfg.timeout_s);
    get_double(s, "world", "collective_check_s", cfg.collective_check_s);
    get_double(s, "world", "watchdog_s", cfg.watchdog_s);
  }

  void check_rendezvous(const std::string& url, const YAML::Mark& m) {
    const std::string where = "world.rendezvous: '" + url + "'";
    if (url.rfind("env://", 0) == 0) return;
    if (url.rfind("file://", 0) == 0) {
      if (url.size() == 7) fail(file_, m, where + " names no file (file:///path/to/rendezvous)");
      return;
    }
    if (url.rfind("tcp://", 0) == 0) {
      std::string hp = url.substr(6);
      size_t colon = hp.rfind(':');
      std::string port = colon == std::string::npos ? "" : hp.substr(colon + 1);
      char* end = nullptr;
      long v = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
      if (colon == 0 || colon == std::string::npos || *end != '\0' || v < 0 || v > 65535)
        fail(file_, m, where + " is not tcp://HOST:PORT (port 0..65535)");
      return;
    }
    fail(file_, m, where + " has an unknown scheme; valid: tcp://HOST:PORT, env://, file://PATH");
  }

  // A component section: a map, or its name alone (`algorithm: zero`).
  YAML::Node component_section(const YAML::Node& root, const char* name) {
    YAML::Node n = root[name];
    return n.IsDefined() && n.IsScalar() ? n : section(root, name);
  }

  void parse_component(const YAML::Node& root, const char* name, ComponentConfig& out) {
    YAML::Node s = component_section(root, name);
    if (!s.IsDefined()) return;  // absent: the default component
    // ABI 1.3: a reducer may wrap another (`inner:`, one level deep).
    const bool reducer = std::string(name) == "reducer";
    parse_component_section(s, key_mark(root, name, mark_of(s)), name, reducer, out);
  }

  // `path` names the section in messages ("reducer", "reducer.inner").
  void parse_component_section(const YAML::Node& s, const YAML::Mark& mark, const std::string& path,
                               bool takes_inner, ComponentConfig& out) {
    out.mark = mark;
    out.node = s;
    if (s.IsNull()) fail(file_, out.mark, path + ": missing required key 'name'");
    if (s.IsScalar()) {  // the name alone: default options
      auto v = to_string(s);
      if (!v || v->empty())
        fail(file_, mark_of(s, out.mark), path + ": expected a component name, got " + describe(s));
      out.name = *v;
      out.options = YAML::Node();
      return;
    }
    if (!s.IsMap()) fail(file_, out.mark, path + ": expected a map, got " + describe(s));
    // path: communicator, control_communicator, reducer, reducer.inner, algorithm
    check_keys(s, path, config_keys(path));
    if (YAML::Node in = child(s, "inner"); takes_inner && in.IsDefined()) {
      auto inner = std::make_shared<ComponentConfig>();
      parse_component_section(in, key_mark(s, "inner", mark_of(in, out.mark)), path + ".inner",
                              false, *inner);
      out.inner = std::move(inner);
    }
    YAML::Node n = s["name"];
    if (!n.IsDefined()) fail(file_, out.mark, path + ": missing required key 'name'");
    auto v = to_string(n);
    if (!v || n.IsNull() || v->empty())
      fail(file_, mark_of(n, out.mark),
           path + ".name: expected a component name, got " + describe(n));
    out.name = *v;
    YAML::Node o = s["options"];
    if (o.IsDefined() && !o.IsNull() && !o.IsMap())
      fail(file_, mark_of(o, out.mark), path + ".options: expected a map, got " + describe(o));
    out.options = o.IsDefined() ? o : YAML::Node();
  }

  void parse_optimizer(const YAML::Node& root, JobConfig& cfg) {
    YAML::Node s = component_section(root, "optimizer");
    if (!s.IsDefined()) return;
    cfg.optimizer_mark = key_mark(root, "optimizer", mark_of(s));
    if (s.IsNull()) fail(file_, cfg.optimizer_mark, "optimizer: missing required key 'name'");
    if (s.IsScalar()) {  // `optimizer: adam`: the name alone, default options
      YAML::Node m(YAML::NodeType::Map);
      m["name"] = s;
      s = m;
    }
    YAML::Node n = s["name"];
    if (!n.IsDefined()) fail(file_, cfg.optimizer_mark, "optimizer: missing required key 'name'");
    auto v = to_string(n);
    if (!v || n.IsNull())
      fail(file_, mark_of(n, cfg.optimizer_mark),
           "optimizer.name: expected a name, got " + describe(n));
    size_t count = 0;
    if (!sdk::optimizer_schema(v->c_str(), &count))
      fail(file_, mark_of(n, cfg.optimizer_mark),
           "optimizer.name: unknown optimizer '" + *v + "'; valid: " + sdk::kOptimizerNames);
    cfg.optimizer_name = *v;
    // The other keys are the optimizer's options; the nodes are shared, so
    // their marks survive for error messages.
    YAML::Node opts(YAML::NodeType::Map);
    for (const auto& kv : s) {
      const YAML::Node k = kv.first;
      if (k.IsScalar() && k.Scalar() == "name") continue;
      // Host keys (lr_schedule_config.hpp), not the inner optimizer's.
      if (k.IsScalar() && k.Scalar() == "lr_schedule") {
        if (!kv.second.IsNull()) cfg.lr_schedule = config::parse_lr_schedule(kv.second, file_);
        continue;
      }
      if (k.IsScalar() && k.Scalar() == "grad_clip") {
        get_double(s, "optimizer", "grad_clip", cfg.grad_clip);
        continue;
      }
      opts.force_insert(k, kv.second);
    }
    cfg.optimizer_options = opts;
    // An unknown key is listed with the host keys too ('lr_schedul' -> lr_schedule).
    const auto& specs = optimizer_option_specs(cfg.optimizer_name);
    std::vector<std::string> valid;
    for (const auto& o : specs) valid.push_back(o.name);
    valid.insert(valid.end(), {"lr_schedule", "grad_clip"});
    for (const auto& kv : opts)
      if (kv.first.IsScalar() &&
          std::find(valid.begin(), valid.end(), kv.first.Scalar()) == valid.end())
        fail(file_, mark_of(kv.first, cfg.optimizer_mark),
             unknown_key_message(kv.first.Scalar(), "optimizer", valid));
    // Keys and types of the inner optimizer do not depend on plugins: check now.
    Options::validate(opts, optimizer_option_specs(cfg.optimizer_name), file_, "optimizer");
  }

  void parse_train(const YAML::Node& s, TrainConfig& t) {
    if (!s.IsDefined() || s.IsNull()) return;
    check_keys(s, "train", config_keys("train"));
    if (YAML::Node m = child(s, "model"); m.IsDefined() && m.IsMap()) {
      check_keys(m, "train.model", config_keys("train.model"));
      get_string(m, "train.model", "torchscript", t.torchscript);
      if (t.torchscript.empty())
        fail(file_, mark_of(m),
             "train.model: a map names a TorchScript file: {torchscript: PATH}; or give a "
             "built-in model: mlp, cnn, resnet");
      t.torchscript = resolve(t.torchscript);
      t.model = "torchscript";
    } else {
      get_choice(s, "train", "model", t.model);
    }
    get_int(s, "train", "model_width", t.model_width);
    get_choice(s, "train", "dataset", t.dataset);
    if (YAML::Node y = child(s, "tensors"); y.IsDefined() && !y.IsNull()) {
      if (!y.IsMap()) fail(file_, mark_of(y), "train.tensors: expected a map, got " + describe(y));
      check_keys(y, "train.tensors", config_keys("train.tensors"));
      get_string(y, "train.tensors", "train", t.train_tensors);
      get_string(y, "train.tensors", "test", t.test_tensors);
      t.train_tensors = resolve(t.train_tensors);
      t.test_tensors = resolve(t.test_tensors);
    }
    if (t.dataset == "tensors" && (t.train_tensors.empty() || t.test_tensors.empty()))
      fail(file_, mark_of(child(s, "dataset")),
           "train.dataset: tensors needs train.tensors: {train: PATH, test: PATH} (files of "
           "Python's torch.save)");
    if (YAML::Node y = child(s, "synthetic"); y.IsDefined() && !y.IsNull()) {
      if (!y.IsMap())
        fail(file_, mark_of(y), "train.synthetic: expected a map, got " + describe(y));
      check_keys(y, "train.synthetic", config_keys("train.synthetic"));
      SyntheticConfig& g = t.synthetic;
      get_int(y, "train.synthetic", "train_samples", g.train_samples);
      get_int(y, "train.synthetic", "test_samples", g.test_samples);
      get_int(y, "train.synthetic", "channels", g.channels);
      get_int(y, "train.synthetic", "height", g.height);
      get_int(y, "train.synthetic", "width", g.width);
      get_int(y, "train.synthetic", "classes", g.classes);
      get_double(y, "train.synthetic", "noise", g.noise);
    }
    get_string(s, "train", "data_dir", t.data_dir);
    get_int(s, "train", "epochs", t.epochs);
    get_int(s, "train", "batch_size", t.batch_size);
    get_int(s, "train", "global_batch_size", t.global_batch_size);
    get_int(s, "train", "seed", t.seed);
    get_int(s, "train", "threads", t.threads);
    get_int(s, "train", "log_every", t.log_every);
    get_int(s, "train", "max_steps", t.max_steps);
    get_bool(s, "train", "drop_last", t.drop_last);
    get_int(s, "train", "grad_accumulation", t.grad_accumulation);
    parse_device(s, t);
  }

  void parse_device(const YAML::Node& s, TrainConfig& t) {
    get_string(s, "train", "device", t.device);
    if (t.device == "cpu") return;
    const YAML::Mark at = mark_of(child(s, "device"));
    const std::string digits = t.device.rfind("cuda:", 0) == 0 ? t.device.substr(5) : "x";
    const bool index_ok = !digits.empty() && digits.size() < 6 &&
                          std::all_of(digits.begin(), digits.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
    if (t.device != "cuda" && !index_ok)
      fail(file_, at, "train.device: '" + t.device + "' is not one of cpu|cuda|cuda:N");
    if (!torch::cuda::is_available())
      fail(file_, at,
           "train.device: '" + t.device +
               "' needs a GPU and a libtorch built with CUDA, and torch::cuda::is_available() "
               "is false here (a CPU-only libtorch such as Debian's, or no GPU visible); use cpu");
  }

  void parse_buffers(const YAML::Node& s, JobConfig& cfg) {
    if (!s.IsDefined()) return;
    check_keys(s, "buffers", config_keys("buffers"));
    std::string sync = buffer_sync_name(cfg.buffer_sync);
    get_choice(s, "buffers", "sync", sync);
    cfg.buffer_sync = parse_buffer_sync(sync);
  }

  void parse_autotune(const YAML::Node& root, JobConfig& cfg) {
    YAML::Node s = section(root, "autotune");
    if (!s.IsDefined()) return;
    cfg.autotune.enabled = true;
    if (!s.IsNull()) {
      check_keys(s, "autotune", config_keys("autotune"));
      get_bool(s, "autotune", "enabled", cfg.autotune.enabled);
      get_bool(s, "autotune", "overlap", cfg.autotune.overlap);
      get_bool(s, "autotune", "hierarchical", cfg.autotune.hierarchical);
      get_int(s, "autotune", "steps", cfg.autotune.steps);
      get_int(s, "autotune", "trials", cfg.autotune.trials);
    }
    if (cfg.autotune.enabled && cfg.elastic.enabled)
      fail(file_, key_mark(root, "autotune", mark_of(s)),
           "autotune: not supported together with elastic: (a recovery rebuilds the optimizer "
           "while settings are being timed); tune a job without elastic training");
    if (cfg.autotune.enabled && !cfg.schedule.empty())
      fail(file_, key_mark(root, "autotune", mark_of(s)),
           "autotune: not supported together with schedule: (a switch would rebuild the "
           "buckets while settings are being timed); tune a job without a schedule");
  }

  void parse_join(const YAML::Node& s, JobConfig& cfg) {
    if (!s.IsDefined() || s.IsNull()) return;
    check_keys(s, "join", config_keys("join"));
    get_bool(s, "join", "enabled", cfg.join.enabled);
    get_bool(s, "join", "divide_by_initial_world_size", cfg.join.divide_by_initial_world_size);
  }

  void parse_elastic(const YAML::Node& s, JobConfig& cfg) {
    if (!s.IsDefined() || s.IsNull()) return;
    check_keys(s, "elastic", config_keys("elastic"));
    JobConfig::Elastic& e = cfg.elastic;
    get_bool(s, "elastic", "enabled", e.enabled);
    get_int(s, "elastic", "min_ranks", e.min_ranks);
    get_int(s, "elastic", "max_ranks", e.max_ranks);
    get_int(s, "elastic", "commit_every", e.commit_every);
    get_double(s, "elastic", "settle_s", e.settle_s);
    if (e.max_ranks > 0 && e.max_ranks < e.min_ranks)
      fail(file_, mark_of(s["max_ranks"]),
           "elastic.max_ranks (" + std::to_string(e.max_ranks) + ") is below elastic.min_ranks (" +
               std::to_string(e.min_ranks) + ")");
  }

  // schedule: [{until_epoch | until_step, algorithm, reducer}, ..., {last}]
  void parse_schedule(const YAML::Node& root, JobConfig& cfg) {
    YAML::Node s = child(root, "schedule");
    if (!s.IsDefined() || s.IsNull()) return;
    if (!s.IsSequence() || s.size() == 0)
      fail(file_, mark_of(s),
           "schedule: expected a list of phases ({until_epoch: N | until_step: N, algorithm: "
           "{...}, reducer: {...}}), got " +
               describe(s));
    int64_t last_epoch = 0, last_step = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      const YAML::Node p = s[k];
      const std::string at = "schedule[" + std::to_string(k) + "]";
      if (!p.IsMap())
        fail(file_, mark_of(p, mark_of(s)), at + ": expected a map, got " + describe(p));
      check_keys(p, at, config_keys("schedule[k]"));
      SchedulePhase ph;
      ph.mark = mark_of(p, mark_of(s));
      if (child(p, "algorithm").IsDefined())
        parse_component(p, "algorithm", ph.algorithm);
      else
        rebind(ph.algorithm, cfg.algorithm);
      if (child(p, "reducer").IsDefined())
        parse_component(p, "reducer", ph.reducer);
      else
        rebind(ph.reducer, cfg.reducer);
      get_int(p, "schedule[k]", "until_epoch", ph.until_epoch, at + ".until_epoch");
      get_int(p, "schedule[k]", "until_step", ph.until_step, at + ".until_step");
      const bool last = k + 1 == s.size();
      const int bounds = (ph.until_epoch >= 0) + (ph.until_step >= 0);
      if (last && bounds)
        fail(file_, ph.mark,
             at + ": the last phase runs to the end of training; remove its " +
                 (ph.until_epoch >= 0 ? "until_epoch" : "until_step"));
      if (!last && bounds != 1)
        fail(file_, ph.mark,
             at + ": give exactly one of until_epoch, until_step (when this phase ends)");
      if (ph.until_epoch >= 0 && ph.until_epoch <= last_epoch)
        fail(file_, mark_of(p["until_epoch"], ph.mark),
             at + ".until_epoch: must be greater than the previous phase's (" +
                 std::to_string(last_epoch) + ")");
      if (ph.until_step >= 0 && ph.until_step <= last_step)
        fail(file_, mark_of(p["until_step"], ph.mark),
             at + ".until_step: must be greater than the previous phase's (" +
                 std::to_string(last_step) + ")");
      if (ph.until_epoch >= 0) last_epoch = ph.until_epoch;
      if (ph.until_step >= 0) last_step = ph.until_step;
      cfg.schedule.push_back(std::move(ph));
    }
  }

  void parse_precision(const YAML::Node& root, JobConfig& cfg) {
    YAML::Node s = section(root, "precision");
    if (!s.IsDefined() || s.IsNull()) return;
    cfg.precision_mark = key_mark(root, "precision", mark_of(s));
    check_keys(s, "precision", config_keys("precision"));
    PrecisionConfig& p = cfg.precision;
    std::string dtype = "fp32";
    get_choice(s, "precision", "dtype", dtype);
    p.dtype = dtype == "bf16"   ? PrecisionDtype::bf16
              : dtype == "fp16" ? PrecisionDtype::fp16
                                : PrecisionDtype::fp32;
    if (YAML::Node d = s["dtype"]; d.IsDefined())
      cfg.precision_mark = mark_of(d, cfg.precision_mark);
    std::string master = "fp32";
    get_choice(s, "precision", "master_weights", master);
    if (YAML::Node ls = s["loss_scale"]; ls.IsDefined()) {
      p.loss_scale_set = true;
      auto text = to_string(ls);
      if (text && *text == "dynamic") {
        p.dynamic = true;
      } else {
        auto v = to_double(ls);
        if (!v)
          fail(file_, mark_of(ls),
               "precision.loss_scale: expected 'dynamic' or a number > 0, got " + describe(ls));
        if (!(*v > 0) || !std::isfinite(*v))
          fail(file_, mark_of(ls),
               "precision.loss_scale: value " + ls.Scalar() + " must be a finite number > 0");
        p.dynamic = false;
        p.static_scale = *v;
      }
    }
    get_double(s, "precision", "init_scale", p.init_scale);
    get_double(s, "precision", "growth_factor", p.growth_factor);
    get_double(s, "precision", "backoff_factor", p.backoff_factor);
    get_int(s, "precision", "growth_interval", p.growth_interval);
    get_double(s, "precision", "min_scale", p.min_scale);
    if (p.dynamic && p.min_scale > p.init_scale)
      fail(file_,
           mark_of(child(s, "min_scale"), mark_of(child(s, "init_scale"), cfg.precision_mark)),
           "precision.min_scale: " + std::to_string(p.min_scale) + " exceeds init_scale " +
               std::to_string(p.init_scale));
  }

  std::string file_, base_dir_;
};

JobConfig parse_text(const std::string& text, const std::string& file,
                     const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail(file, e.mark, "YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    fail(file, e.mark, "YAML error: " + e.msg);
  }
  return Parser(file, base_dir).parse(root);
}

// Options of one component, with the section's mark for a required option
// when the YAML gives no `options:` map at all.
Options validate_options(const YAML::Node& node, const std::vector<OptionSpec>& schema,
                         const std::string& file, const std::string& where,
                         const YAML::Mark& section_mark) {
  if (!node.IsDefined() || node.IsNull())
    for (const auto& s : schema)
      if (!s.default_value)
        fail(file, section_mark,
             where + ": missing required option '" + s.name + "'" +
                 (s.help.empty() ? "" : " (" + s.help + ")"));
  return Options::validate(node, schema, file, where);
}

}  // namespace

JobConfig load_job_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read the job file: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string abs;
  JobConfig cfg =
      parse_text(ss.str(), path, pfs::absolute(path, abs) ? pfs::parent_path(abs) : ".");
  // A job file with no sections is almost always a mistake (a wrong or
  // truncated file); running every default would hide it.
  if (!cfg.root.IsDefined() || cfg.root.IsNull())
    throw ConfigError(path +
                      ": the job file is empty (no sections); a job names at least its "
                      "sections, e.g. share/distopt/examples/allreduce-sgd.yaml");
  return cfg;
}

JobConfig parse_job_config(const std::string& yaml_text, const std::string& name) {
  return parse_text(yaml_text, name, "");
}

const std::vector<OptionSpec>& bucket_option_specs() {
  static const std::vector<OptionSpec> specs = [] {
    std::vector<OptionSpec> v(3);
    v[0].name = "bucket_cap_mb";
    v[0].type = DOPT_OPTION_DOUBLE;
    v[0].default_value = format_number(kDefaultBucketCapMb);
    v[0].min_value = 0;
    v[0].min_exclusive = true;  // (0, 1e6]
    v[0].max_value = 1e6;
    v[0].help = "gradient bucket size cap in MiB, > 0 (core bucketing)";
    v[1].name = "align_bytes";
    v[1].type = DOPT_OPTION_INT;
    // 16 would suit CUDA's vectorised loads (PyTorch's multi-tensor
    // optimizer kernels fall back to scalar code on 8-byte aligned
    // gradients), but padding changes what the gossip and compression
    // plugins send and quantise (their tests pin byte counts and bounds at
    // 8); a job can set 16 (STATUS.md, "On a GPU").
    v[1].default_value = std::to_string(kDefaultAlignBytes);
    v[1].min_value = 1;
    v[1].max_value = 4096;
    v[1].help = "byte alignment of each gradient inside a bucket, a power of two (core bucketing)";
    v[2].name = "overlap";
    v[2].type = DOPT_OPTION_BOOL;
    v[2].default_value = kDefaultOverlap ? "true" : "false";
    v[2].help = "reduce each bucket as soon as it is complete in backward; false = after backward";
    return v;
  }();
  return specs;
}

const std::vector<OptionSpec>& optimizer_option_specs(const std::string& name) {
  static const std::map<std::string, std::vector<OptionSpec>> all = [] {
    std::map<std::string, std::vector<OptionSpec>> m;
    for (const char* n : {"sgd", "adam", "adamw", "adagrad", "rmsprop"}) {
      size_t count = 0;
      const dopt_option_spec* s = sdk::optimizer_schema(n, &count);
      if (s) m[n] = specs_from_c(s, count);
    }
    return m;
  }();
  auto it = all.find(name);
  if (it == all.end())
    throw ConfigError("unknown optimizer '" + name +
                      "'; valid: " + std::string(sdk::kOptimizerNames));
  return it->second;
}

namespace {
// The job's components with their options, validated and checked (one
// reducer + algorithm pair: the top level, or a schedule phase).
ValidatedJob validate_components(const JobConfig& cfg, const PluginRegistry& registry,
                                 int64_t world_size);

// A reducer option `momentum` means the reducer applies the momentum itself
// (DGC momentum correction, plugins/compress): momentum applied twice is
// 1 / (1 - m)^2 times the step, so the combination is refused.
void check_momentum_owner(const JobConfig& cfg, const ValidatedJob& v) {
  auto positive = [](const Options& o) {
    return o.has("momentum") && o.values().at("momentum").index() == 2 &&
           o.get_double("momentum") > 0;
  };
  if (!positive(v.reducer) || !positive(v.optimizer)) return;
  fail(cfg.path, mark_of(child(cfg.reducer.options, "momentum"), cfg.reducer.mark),
       "reducer.options.momentum: reducer '" + cfg.reducer.name +
           "' applies momentum itself (momentum correction), and optimizer.momentum is " +
           yaml::format_number(v.optimizer.get_double("momentum")) +
           ": set optimizer.momentum: 0 (or drop reducer.options.momentum)");
}
}  // namespace

JobConfig with_components(const JobConfig& cfg, const ComponentConfig& algorithm,
                          const ComponentConfig& reducer) {
  JobConfig out = cfg;
  rebind(out.algorithm, algorithm);
  rebind(out.reducer, reducer);
  out.schedule.clear();
  // The same nodes (so marks point into the file), with these sections.
  YAML::Node root(YAML::NodeType::Map);
  if (cfg.root.IsMap())
    for (const auto& kv : cfg.root) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
      if (key != "algorithm" && key != "reducer" && key != "schedule")
        root.force_insert(kv.first, kv.second);
    }
  auto section = [](const ComponentConfig& c) {
    if (c.node.IsDefined() && c.node.IsMap()) return c.node;
    YAML::Node n(YAML::NodeType::Map);
    n["name"] = c.name;
    if (c.options.IsDefined() && !c.options.IsNull()) n["options"] = c.options;
    return n;
  };
  root["algorithm"] = section(algorithm);
  root["reducer"] = section(reducer);
  out.root = root;
  return out;
}

void check_plugin_dirs(const JobConfig& cfg) {
  for (const auto& d : cfg.plugin_dirs) {
    struct stat st {};
    std::string why;
    if (::stat(d.resolved.c_str(), &st) != 0)
      why = std::strerror(errno);
    else if (!S_ISDIR(st.st_mode))
      why = "not a directory";
    if (why.empty()) continue;
    const std::string shown = d.written == d.resolved ? "'" + d.written + "'"
                                                      : "'" + d.written + "' (" + d.resolved + ")";
    fail(cfg.path, d.mark, "plugins.paths: " + shown + " is not a plugin directory: " + why);
  }
}

ValidatedJob validate_job(const JobConfig& cfg, const PluginRegistry& registry,
                          int64_t world_size) {
  ValidatedJob out = validate_components(cfg, registry, world_size);
  for (size_t k = 0; k < cfg.schedule.size(); ++k) {
    const SchedulePhase& ph = cfg.schedule[k];
    try {
      ValidatedJob v =
          validate_components(with_components(cfg, ph.algorithm, ph.reducer), registry, world_size);
      out.phases.push_back({std::move(v.reducer), std::move(v.algorithm)});
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (in schedule[" + std::to_string(k) + "])");
    }
  }
  return out;
}

namespace {
ValidatedJob validate_components(const JobConfig& cfg, const PluginRegistry& registry,
                                 int64_t world_size) {
  const std::string& file = cfg.path;
  auto component = [&](dopt_component_kind kind, const char* section,
                       const ComponentConfig& cc) -> const ComponentInfo& {
    if (const ComponentInfo* c = registry.find(kind, cc.name)) return *c;
    YAML::Mark m = mark_of(child(child(cfg.root, section), "name"), cc.mark);
    // A section the file leaves out selects the default component: say so.
    const std::string what =
        child(cfg.root, section).IsDefined()
            ? std::string(section) + ".name: "
            : std::string(section) + " (not set in the file; the default is '" + cc.name + "'): ";
    try {
      registry.get(kind, cc.name);  // throws with what is available and what was skipped
    } catch (const PluginError& e) {
      fail(file, m, what + e.what());
    }
    fail(file, m,
         std::string(section) + ".name: no " + kind_name(kind) + " named '" + cc.name + "'");
  };

  ValidatedJob out;
  const ComponentInfo& comm = component(DOPT_KIND_COMMUNICATOR, "communicator", cfg.communicator);
  const ComponentInfo& red = component(DOPT_KIND_REDUCER, "reducer", cfg.reducer);
  const ComponentInfo& alg = component(DOPT_KIND_ALGORITHM, "algorithm", cfg.algorithm);
  config::check_grad_clip_support(cfg, alg);

  // A communicator's own timeout_s defaults to world.timeout_s (the one
  // timeout a user sets for the job) unless its options set it.
  // A new map holding the written nodes (not a clone: errors keep their line).
  auto comm_options = [&](const ComponentConfig& cc, const ComponentInfo& ci, const char* section) {
    YAML::Node opts;
    if (cc.options.IsMap()) {
      opts = YAML::Node(YAML::NodeType::Map);
      for (const auto& kv : cc.options) opts.force_insert(kv.first, kv.second);
    }
    auto spec = std::find_if(ci.options.begin(), ci.options.end(), [](const auto& s) {
      return s.name == "timeout_s" && s.type == DOPT_OPTION_DOUBLE;
    });
    const bool has_timeout = spec != ci.options.end();
    const bool malformed = cc.options.IsDefined() && !cc.options.IsNull() &&
                           !cc.options.IsMap();  // validate_options reports it as written
    if (malformed) opts = cc.options;
    if (has_timeout && !malformed && !opts["timeout_s"])
      opts["timeout_s"] = spec->min_value <= spec->max_value
                              ? std::clamp(cfg.timeout_s, spec->min_value, spec->max_value)
                              : cfg.timeout_s;
    return validate_options(opts, ci.options, file, std::string(section) + ".options", cc.mark);
  };
  out.communicator = comm_options(cfg.communicator, comm, "communicator");

  // The host's own collectives are in host memory: a communicator that does
  // not accept it gets a control communicator beside it (tcp by default).
  const bool comm_hosts = device_accepted(comm.devices, kDLCPU);
  if (!cfg.control_communicator.name.empty() || !comm_hosts) {
    ComponentConfig cc = cfg.control_communicator;
    const bool defaulted = cc.name.empty();
    if (defaulted) cc.name = "tcp";
    if (defaulted && !registry.find(DOPT_KIND_COMMUNICATOR, cc.name))
      fail(file, mark_of(child(child(cfg.root, "communicator"), "name"), cfg.communicator.mark),
           "communicator '" + cfg.communicator.name + "' accepts " + devices_text(comm.devices) +
               " memory only, and the host's own collectives (evaluation, flags, agreements) "
               "need a host-memory communicator beside it: the default control_communicator "
               "'tcp' is not found; set control_communicator: NAME (one that accepts kDLCPU)");
    const ComponentInfo& ctl = component(DOPT_KIND_COMMUNICATOR, "control_communicator", cc);
    if (!device_accepted(ctl.devices, kDLCPU))
      fail(file, mark_of(child(child(cfg.root, "control_communicator"), "name"), cc.mark),
           "control_communicator.name: communicator '" + ctl.name + "' accepts " +
               devices_text(ctl.devices) +
               " memory only; the control communicator carries host memory (kDLCPU)");
    out.control_name = ctl.name;
    out.control_options = comm_options(cc, ctl, "control_communicator");
  }

  // A reducer also takes core's bucketing options (its own declaration wins).
  std::vector<OptionSpec> rschema = red.options;
  for (const auto& b : bucket_option_specs()) {
    bool declared = false;
    for (const auto& s : rschema) declared = declared || s.name == b.name;
    if (!declared) rschema.push_back(b);
  }
  out.reducer =
      validate_options(cfg.reducer.options, rschema, file, "reducer.options", cfg.reducer.mark);
  auto value_mark = [&](const char* key) {
    return mark_of(child(cfg.reducer.options, key), cfg.reducer.mark);
  };
  // Core's bucketing needs these whatever range a reducer that redeclares
  // them gives (bucket_cap_mb's own schema range is (0, 1e6]).
  if (out.reducer.has("bucket_cap_mb") && out.reducer.values().at("bucket_cap_mb").index() == 2 &&
      !(out.reducer.get_double("bucket_cap_mb") > 0))
    fail(file, value_mark("bucket_cap_mb"), "reducer.options.bucket_cap_mb: must be > 0 (MiB)");
  if (out.reducer.has("align_bytes") && out.reducer.values().at("align_bytes").index() == 1) {
    int64_t a = out.reducer.get_int("align_bytes");
    if (a <= 0 || (a & (a - 1)) != 0)
      fail(file, value_mark("align_bytes"),
           "reducer.options.align_bytes: value " + std::to_string(a) + " is not a power of two");
  }

  config::attach_inner_reducer(cfg, cfg.reducer, "reducer", registry, red, out.reducer);

  out.algorithm = validate_options(cfg.algorithm.options, alg.options, file, "algorithm.options",
                                   cfg.algorithm.mark);

  const std::vector<OptionSpec>* ospecs = nullptr;
  try {
    ospecs = &optimizer_option_specs(cfg.optimizer_name);
  } catch (const ConfigError& e) {
    fail(file, mark_of(child(child(cfg.root, "optimizer"), "name"), cfg.optimizer_mark),
         std::string("optimizer.name: ") + e.what());
  }
  out.optimizer =
      validate_options(cfg.optimizer_options, *ospecs, file, "optimizer", cfg.optimizer_mark);
  check_momentum_owner(cfg, out);
  // ABI 1.2: components that can see the whole job may refuse it.
  config::check_job_with_components(cfg, world_size, {&comm, &out.communicator, &comm.options},
                                    {&red, &out.reducer, &rschema},
                                    {&alg, &out.algorithm, &alg.options}, out.optimizer, *ospecs);
  return out;
}

}  // namespace

}  // namespace distopt
