// The plugin registry: finds plugin libraries, loads them with Boost.DLL
// (RTLD_NOW | RTLD_LOCAL), calls dopt_plugin_init_v1 and validates what the
// plugin declares before any of its components can be selected.
#include "distopt/registry.hpp"

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "base/posix_fs.hpp"
#include "base/yaml_util.hpp"
#include "distopt/algorithm.h"
#include "distopt/communicator.h"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/job.h"
#include "distopt/reducer.h"

namespace distopt {
namespace {

namespace pfs = util;

constexpr size_t kMaxComponents = 4096;
constexpr size_t kMaxOptions = 4096;

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

template <typename T>
size_t round_up(size_t n) {
  return (n + alignof(T) - 1) / alignof(T) * alignof(T);
}

/// Stride of an array of extensible structs: the plugin's sizeof(T). That
/// is the size T had in the headers of the ABI minor the plugin declares
/// (`size_at_minor`: a 1.1 plugin's dopt_component is smaller than this
/// host's, even though a 1.2 plugin may leave struct_size at the 1.0 value
/// with the appended fields zeroed), or the first element's struct_size
/// rounded up to the alignment when that is larger (a newer minor's).
template <typename T>
size_t array_stride(const T* first, size_t size_at_minor) {
  return round_up<T>(std::max(size_at_minor, first->struct_size));
}

/// sizeof(dopt_component) and sizeof(dopt_option_spec) in the headers of ABI
/// minor `minor` (both grew in 1.2, dopt_component again in 1.4; the
/// alignment did not).
size_t component_size_at(uint32_t minor) {
  if (minor >= 4) return sizeof(dopt_component);
  // 1.2 / 1.3 had no tail padding; 1.4 appended `devices`.
  if (minor >= 2) return round_up<dopt_component>(DOPT_COMPONENT_V1_2_STRUCT_SIZE);
  return round_up<dopt_component>(DOPT_COMPONENT_STRUCT_SIZE);
}
size_t option_spec_size_at(uint32_t minor) {
  return minor >= 2 ? sizeof(dopt_option_spec)
                    : round_up<dopt_option_spec>(DOPT_OPTION_SPEC_STRUCT_SIZE);
}
template <typename T>
const T* element(const T* base, size_t stride, size_t i) {
  return reinterpret_cast<const T*>(reinterpret_cast<const char*>(base) + i * stride);
}

// The names of the required vtable functions that are NULL.
#define DOPT_REQUIRE_FN(VT, FIELD) \
  if (!(VT)->FIELD) missing.push_back(#FIELD)

std::vector<std::string> null_fields(dopt_component_kind kind, const void* vtable) {
  std::vector<std::string> missing;
  switch (kind) {
    case DOPT_KIND_COMMUNICATOR: {
      const auto* vt = static_cast<const dopt_communicator_v1*>(vtable);
      DOPT_REQUIRE_FN(vt, create);
      DOPT_REQUIRE_FN(vt, destroy);
      DOPT_REQUIRE_FN(vt, rank);
      DOPT_REQUIRE_FN(vt, world_size);
      DOPT_REQUIRE_FN(vt, allreduce);
      DOPT_REQUIRE_FN(vt, reduce_scatter);
      DOPT_REQUIRE_FN(vt, allgather);
      DOPT_REQUIRE_FN(vt, broadcast);
      DOPT_REQUIRE_FN(vt, send);
      DOPT_REQUIRE_FN(vt, recv);
      DOPT_REQUIRE_FN(vt, barrier);
      DOPT_REQUIRE_FN(vt, split);
      DOPT_REQUIRE_FN(vt, test);
      DOPT_REQUIRE_FN(vt, wait);
      DOPT_REQUIRE_FN(vt, request_free);
      break;
    }
    case DOPT_KIND_REDUCER: {
      const auto* vt = static_cast<const dopt_reducer_v1*>(vtable);
      DOPT_REQUIRE_FN(vt, create);
      DOPT_REQUIRE_FN(vt, destroy);
      DOPT_REQUIRE_FN(vt, reduce);
      DOPT_REQUIRE_FN(vt, test);
      DOPT_REQUIRE_FN(vt, wait);
      DOPT_REQUIRE_FN(vt, request_free);
      DOPT_REQUIRE_FN(vt, bytes_sent);
      break;
    }
    case DOPT_KIND_ALGORITHM: {
      const auto* vt = static_cast<const dopt_algorithm_v1*>(vtable);
      DOPT_REQUIRE_FN(vt, create);
      DOPT_REQUIRE_FN(vt, destroy);
      DOPT_REQUIRE_FN(vt, on_bucket_ready);
      DOPT_REQUIRE_FN(vt, step);
      DOPT_REQUIRE_FN(vt, set_lr);
      DOPT_REQUIRE_FN(vt, state_bytes);
      break;
    }
  }
  return missing;
}
#undef DOPT_REQUIRE_FN

size_t vtable_min_size(dopt_component_kind kind) {
  switch (kind) {
    case DOPT_KIND_COMMUNICATOR:
      return DOPT_COMMUNICATOR_V1_STRUCT_SIZE;
    case DOPT_KIND_REDUCER:
      return DOPT_REDUCER_V1_STRUCT_SIZE;
    case DOPT_KIND_ALGORITHM:
      return DOPT_ALGORITHM_V1_STRUCT_SIZE;
  }
  return 0;
}

bool valid_kind(int k) {
  return k == DOPT_KIND_COMMUNICATOR || k == DOPT_KIND_REDUCER || k == DOPT_KIND_ALGORITHM;
}

/// The loader's own words from a Boost.DLL exception ("...: invalid ELF header").
std::string loader_message(const std::exception& e) {
  std::string what = e.what();
  const std::string tag = "(dlerror system message: ";
  size_t p = what.find(tag);
  if (p == std::string::npos) return what;
  std::string msg = what.substr(p + tag.size());
  size_t end = msg.rfind(')');
  return end == std::string::npos ? msg : msg.substr(0, end);
}

/// Validate one component as the plugin declared it; returns "" if fine.
std::string check_component(const dopt_component* c, size_t index, const std::string& file,
                            uint32_t abi_minor, ComponentInfo& out) {
  const std::string at = "component #" + std::to_string(index);
  if (c->struct_size < DOPT_COMPONENT_STRUCT_SIZE)
    return at + ": struct_size " + std::to_string(c->struct_size) +
           " is smaller than the ABI v1.0 size " + std::to_string(DOPT_COMPONENT_STRUCT_SIZE);
  if (!c->name || !*c->name) return at + ": has no name";
  const std::string who = "component '" + std::string(c->name) + "'";
  if (!valid_kind(c->kind)) return who + ": unknown kind " + std::to_string(c->kind);
  const auto kind = static_cast<dopt_component_kind>(c->kind);
  const char* kn = kind_name(kind);
  if (!c->vtable) return who + ": " + kn + " vtable is NULL";
  const size_t vt_size =
      *static_cast<const size_t*>(c->vtable);  // every vtable begins with struct_size
  if (vt_size < vtable_min_size(kind))
    return who + ": " + kn + " vtable struct_size " + std::to_string(vt_size) +
           " is smaller than the ABI v1.0 size " + std::to_string(vtable_min_size(kind));
  auto missing = null_fields(kind, c->vtable);
  if (missing.size() == 1) return who + ": " + kn + " vtable field '" + missing[0] + "' is NULL";
  if (!missing.empty())
    return who + ": " + kn + " vtable fields '" + yaml::join(missing, "', '") + "' are NULL";

  if (c->num_options > kMaxOptions)
    return who + ": implausible num_options " + std::to_string(c->num_options);
  if (c->num_options > 0 && !c->options)
    return who + ": declares " + std::to_string(c->num_options) + " options but options is NULL";
  if (c->num_options > 0 && c->options->struct_size < DOPT_OPTION_SPEC_STRUCT_SIZE)
    return who + ": option spec struct_size " + std::to_string(c->options->struct_size) +
           " is smaller than the ABI v1.0 size " + std::to_string(DOPT_OPTION_SPEC_STRUCT_SIZE);
  const size_t spec_stride =
      c->num_options > 0 ? array_stride(c->options, option_spec_size_at(abi_minor)) : 0;
  if (c->num_options > 0) {
    const size_t stride = spec_stride;
    for (size_t i = 0; i < c->num_options; ++i) {
      const dopt_option_spec* s = element(c->options, stride, i);
      if (s->struct_size < DOPT_OPTION_SPEC_STRUCT_SIZE)
        return who + ": option #" + std::to_string(i) + " struct_size " +
               std::to_string(s->struct_size) + " is smaller than the ABI v1.0 size";
      if (!s->name || !*s->name) return who + ": option #" + std::to_string(i) + " has no name";
      if (s->type < DOPT_OPTION_BOOL || s->type > DOPT_OPTION_STRING)
        return who + ": option '" + s->name + "' has unknown type " +
               std::to_string(static_cast<int>(s->type));
    }
  }
  out.kind = kind;
  out.name = c->name;
  out.version = c->version ? c->version : "";
  out.description = c->description ? c->description : "";
  out.options = c->num_options ? specs_from_c(c->options, c->num_options, spec_stride)
                               : std::vector<OptionSpec>{};
  out.vtable = c->vtable;
  out.file = file;
  if (DOPT_HAS_FIELD(c, dopt_component, check_job)) {  // ABI 1.2
    out.traits = c->traits;
    out.check_job = c->check_job;
  }
  out.devices = DOPT_DEVICES_DEFAULT;
  if (DOPT_HAS_FIELD(c, dopt_component, devices) && c->devices != 0)  // ABI 1.4
    out.devices = c->devices;
  // Option names must be unique and every default must be valid for its own schema.
  for (size_t i = 0; i < out.options.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (out.options[i].name == out.options[j].name)
        return who + ": option '" + out.options[i].name + "' is declared twice";
    const OptionSpec& s = out.options[i];
    if (!s.default_value) continue;
    try {
      Options::validate(YAML::Node(), {s}, "", "options");
    } catch (const ConfigError& e) {
      // Keep the reason only ("expected an integer, got 'many'").
      std::string why = e.what();
      const std::string tag = "(default): ";
      if (size_t p = why.find(tag); p != std::string::npos) why = why.substr(p + tag.size());
      if (size_t p = why.find(" [the component's schema"); p != std::string::npos) why.resize(p);
      return who + ": option '" + s.name + "' has an invalid default '" + *s.default_value +
             "': " + why;
    }
  }
  return "";
}

bool same_file(const std::string& a, const std::string& b) {
  return a == b || pfs::same_file(a, b);
}

}  // namespace

const char* kind_name(dopt_component_kind kind) {
  switch (kind) {
    case DOPT_KIND_COMMUNICATOR:
      return "communicator";
    case DOPT_KIND_REDUCER:
      return "reducer";
    case DOPT_KIND_ALGORITHM:
      return "algorithm";
  }
  return "unknown-kind";
}

std::string dl_device_name(int32_t t) {
  switch (t) {
    case kDLCPU:
      return "kDLCPU";
    case kDLCUDA:
      return "kDLCUDA";
    case kDLCUDAHost:
      return "kDLCUDAHost";
    case kDLOpenCL:
      return "kDLOpenCL";
    case kDLVulkan:
      return "kDLVulkan";
    case kDLMetal:
      return "kDLMetal";
    case kDLVPI:
      return "kDLVPI";
    case kDLROCM:
      return "kDLROCM";
    case kDLROCMHost:
      return "kDLROCMHost";
    case kDLExtDev:
      return "kDLExtDev";
    case kDLCUDAManaged:
      return "kDLCUDAManaged";
    case 14:  // kDLOneAPI, in newer DLPack headers than some builds have
      return "kDLOneAPI";
  }
  return "device type " + std::to_string(t);
}

std::string devices_text(uint32_t devices) {
  std::vector<std::string> names;
  for (int32_t t = 0; t < 32; ++t)
    if (devices & DOPT_DEVICE_BIT(t)) names.push_back(dl_device_name(t));
  return names.empty() ? std::string("(none)") : yaml::join(names, ", ");
}

PluginRegistry::PluginRegistry() = default;
PluginRegistry::~PluginRegistry() = default;

void PluginRegistry::discover(const std::vector<std::string>& dirs) {
  for (const auto& dir : dirs) {
    if (!pfs::is_directory(dir)) {
      log(DOPT_LOG_DEBUG, "registry", "plugin directory " + dir + " does not exist; ignored");
      continue;
    }
    std::vector<std::string> files;
    try {
      for (const std::string& n : pfs::list_dir(dir)) {
        const std::string p = pfs::join(dir, n);
        if (pfs::extension(p) == ".so" && pfs::is_regular_file(p)) files.push_back(p);
      }
    } catch (const std::system_error& e) {
      log(DOPT_LOG_WARN, "registry",
          "cannot list plugin directory " + dir + ": " + e.code().message());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) load_file(f);
  }
}

namespace {

// The steps of PluginRegistry::load_file. Each returns why the plugin is
// skipped, "" to go on.

// dlopen(3)s `file` (RTLD_NOW | RTLD_LOCAL) into `lib`.
std::string open_library(const std::string& file, boost::dll::shared_library& lib) {
  try {
    lib.load(boost::dll::fs::path(file),
             boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    std::string msg = loader_message(e);
    if (msg.rfind(file + ": ", 0) == 0) msg.erase(0, file.size() + 2);  // the file is named already
    return "cannot be loaded: " + msg;
  }
  return "";
}

// Whether `lib` exports the v1 entry point; if not, names the other major it
// was built for, when it exports one.
std::string check_entry_symbol(const boost::dll::shared_library& lib) {
  if (lib.has(DOPT_PLUGIN_ENTRY_V1)) return "";
  for (int major = 2; major <= 9; ++major) {
    const std::string other = "dopt_plugin_init_v" + std::to_string(major);
    if (lib.has(other))
      return "exports " + other + " (plugin ABI major " + std::to_string(major) +
             ") but this host speaks ABI " +
             version_string(DOPT_ABI_VERSION_MAJOR, DOPT_ABI_VERSION_MINOR) +
             " and needs " DOPT_PLUGIN_ENTRY_V1;
  }
  return "missing the entry symbol " DOPT_PLUGIN_ENTRY_V1
         " (not a distopt plugin, or the symbol is not exported)";
}

// Calls the entry point into `info` and checks the ABI version it reports
// (same major; a newer minor is loaded, with a debug line).
std::string call_entry(const boost::dll::shared_library& lib, const std::string& file,
                       dopt_plugin_info& info) {
  auto init = lib.get<dopt_status(const dopt_host_api*, dopt_plugin_info*)>(DOPT_PLUGIN_ENTRY_V1);
  std::memset(&info, 0, sizeof info);
  info.struct_size = DOPT_PLUGIN_INFO_STRUCT_SIZE;
  take_last_error();
  dopt_status st = DOPT_ERR_INTERNAL;
  try {
    st = init(host_api(), &info);
  } catch (...) {  // the ABI says noexcept; a plugin that throws anyway is refused, not fatal
    return DOPT_PLUGIN_ENTRY_V1 " threw a C++ exception across the C ABI";
  }
  if (st < 0) {
    std::string detail = take_last_error();
    return DOPT_PLUGIN_ENTRY_V1 " failed (" + std::string(dopt_status_string(st)) + ")" +
           (detail.empty() ? "" : ": " + detail);
  }
  if (info.abi_major != DOPT_ABI_VERSION_MAJOR)
    return "built for plugin ABI " + version_string(info.abi_major, info.abi_minor) +
           ", but this host speaks ABI " +
           version_string(DOPT_ABI_VERSION_MAJOR, DOPT_ABI_VERSION_MINOR) +
           " (the major version must match)";
  if (info.abi_minor > DOPT_ABI_VERSION_MINOR)
    log(DOPT_LOG_DEBUG, "registry",
        file + " was built for plugin ABI " + version_string(info.abi_major, info.abi_minor) +
            ", newer than the host's " +
            version_string(DOPT_ABI_VERSION_MAJOR, DOPT_ABI_VERSION_MINOR) +
            "; loading it (same major)");
  return "";
}

// The component array's count, pointer and first struct_size.
std::string check_component_array(const dopt_plugin_info& info) {
  if (info.num_components == 0) return "declares no components";
  if (info.num_components > kMaxComponents)
    return "declares an implausible number of components (" + std::to_string(info.num_components) +
           ")";
  if (!info.components)
    return "declares " + std::to_string(info.num_components) + " components but components is NULL";
  if (info.components->struct_size < DOPT_COMPONENT_STRUCT_SIZE)
    return "component struct_size " + std::to_string(info.components->struct_size) +
           " is smaller than the ABI v1.0 size " + std::to_string(DOPT_COMPONENT_STRUCT_SIZE);
  return "";
}

// Reads and checks every component of `info` into `found`, refusing a kind
// and name declared twice or already in `loaded`.
std::string read_components(const dopt_plugin_info& info, const std::string& file,
                            const std::shared_ptr<boost::dll::shared_library>& lib,
                            const std::vector<ComponentInfo>& loaded,
                            std::vector<ComponentInfo>& found) {
  const size_t stride = array_stride(info.components, component_size_at(info.abi_minor));
  for (size_t i = 0; i < info.num_components; ++i) {
    ComponentInfo ci;
    std::string err =
        check_component(element(info.components, stride, i), i, file, info.abi_minor, ci);
    if (!err.empty()) return err;
    for (const auto& f : found)
      if (f.kind == ci.kind && f.name == ci.name)
        return std::string("declares ") + kind_name(ci.kind) + " '" + ci.name + "' twice";
    for (const auto& c : loaded)
      if (c.kind == ci.kind && c.name == ci.name)
        return std::string("duplicate ") + kind_name(ci.kind) + " '" + ci.name +
               "': already provided by " + c.file;
    ci.plugin_name = info.plugin_name ? info.plugin_name : "";
    ci.plugin_version = info.plugin_version ? info.plugin_version : "";
    ci.abi_major = info.abi_major;
    ci.abi_minor = info.abi_minor;
    ci.library = lib;  // shared ownership keeps the .so mapped while any copy lives
    found.push_back(std::move(ci));
  }
  return "";
}

}  // namespace

bool PluginRegistry::load_file(const std::string& path) {
  std::string abs;
  const std::string file = pfs::lexically_normal(pfs::absolute(path, abs) ? abs : path);

  // The same library reached twice (a directory listed twice, a symlink):
  // once is enough, and it is not a duplicate of itself.
  for (const auto& c : components_)
    if (same_file(c.file, file)) return true;
  for (const auto& s : skipped_)
    if (same_file(s.file, file)) return false;

  auto lib = std::make_shared<boost::dll::shared_library>();
  dopt_plugin_info info;
  std::vector<ComponentInfo> found;
  std::string reason = open_library(file, *lib);
  if (reason.empty()) reason = check_entry_symbol(*lib);
  if (reason.empty()) reason = call_entry(*lib, file, info);
  if (reason.empty()) reason = check_component_array(info);
  if (reason.empty()) reason = read_components(info, file, lib, components_, found);
  if (!reason.empty()) {
    skipped_.push_back({file, reason});
    log(DOPT_LOG_WARN, "registry", "skipping plugin " + file + ": " + reason);
    return false;
  }
  for (auto& c : found) {
    log(DOPT_LOG_DEBUG, "registry",
        std::string("loaded ") + kind_name(c.kind) + " '" + c.name + "' from " + file);
    components_.push_back(std::move(c));
  }
  return true;
}

const ComponentInfo* PluginRegistry::find(dopt_component_kind kind, const std::string& name) const {
  for (const auto& c : components_)
    if (c.kind == kind && c.name == name) return &c;
  return nullptr;
}

const ComponentInfo& PluginRegistry::get(dopt_component_kind kind, const std::string& name) const {
  if (const ComponentInfo* c = find(kind, name)) return *c;
  const std::string kn = kind_name(kind);
  std::vector<std::string> names;
  for (const auto& c : components_)
    if (c.kind == kind) names.push_back(c.name);
  std::string msg = "no " + kn + " named '" + name + "' is available; available " + kn +
                    "s: " + (names.empty() ? std::string("(none)") : yaml::join(names));
  if (const std::string best = yaml::closest_match(name, names); !best.empty())
    msg += " (did you mean '" + best + "'?)";
  // A skipped library that names the component (in its reason or its file
  // name, libdistopt_<name>.so) is the likely reason: put it first.
  std::vector<const SkippedPlugin*> likely, other;
  for (const auto& s : skipped_) {
    const std::string stem = pfs::stem(s.file);
    bool match = s.reason.find("'" + name + "'") != std::string::npos ||
                 stem == "libdistopt_" + name || stem == "lib" + name || stem == name;
    (match ? likely : other).push_back(&s);
  }
  for (const auto* s : likely)
    msg += "\n  '" + name + "' is unavailable because " + s->file + " was skipped: " + s->reason;
  if (!other.empty()) {
    msg += "\n  other skipped plugin libraries:";
    for (const auto* s : other) msg += "\n    " + s->file + ": " + s->reason;
  }
  if (components_.empty() && skipped_.empty())
    msg +=
        "\n  (no plugin libraries were found: check plugins.paths, $DISTOPT_PLUGIN_PATH or "
        "--plugin-path)";
  throw PluginError(msg);
}

std::vector<std::string> PluginRegistry::search_path(const std::vector<std::string>& cli_paths,
                                                     const std::vector<std::string>& config_paths) {
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    if (p.empty()) return;
    std::string norm = pfs::lexically_normal(p);
    if (std::find(out.begin(), out.end(), norm) == out.end()) out.push_back(norm);
  };
  for (const auto& p : cli_paths) {
    std::string abs;
    add(pfs::absolute(p, abs) ? abs : p);
  }
  for (const auto& p : config_paths) add(p);
  if (const char* env = std::getenv("DISTOPT_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      add(s.substr(start, end - start));
      start = end + 1;
    }
  }
  // The installation this libdistopt_core came from, even if it was moved
  // after install (a relocated prefix): <its libdir>/distopt/plugins.
  boost::system::error_code ec;
  boost::dll::fs::path self = boost::dll::this_line_location(ec);
  // Run from the build tree (build/bin/distopt, tests, an uninstalled
  // embedding): that tree's plugins, as an install finds its own.
  const std::string build_dir = DISTOPT_BUILD_DIR;
  if (!ec && self.string().rfind(build_dir + "/", 0) == 0) add(DISTOPT_BUILD_PLUGIN_DIR);
  if (!ec) add((self.parent_path() / "distopt" / "plugins").string());
  add(DISTOPT_INSTALL_PLUGIN_DIR);
  return out;
}

}  // namespace distopt
