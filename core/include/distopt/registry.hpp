// Plugin discovery and loading (Boost.DLL, RTLD_NOW | RTLD_LOCAL).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distopt/abi.h"
#include "distopt/component_options.hpp"

namespace distopt {

/// One component found in a plugin library. Copies keep the library loaded.
struct ComponentInfo {
  dopt_component_kind kind{};
  std::string name, version, description;
  std::string plugin_name, plugin_version, file;
  uint32_t abi_major = 0, abi_minor = 0;
  std::vector<OptionSpec> options;
  const void* vtable = nullptr;  ///< dopt_communicator_v1* / dopt_reducer_v1* / dopt_algorithm_v1*
  uint32_t traits = 0;           ///< ABI 1.2: DOPT_TRAIT_* it declares (0 before)
  dopt_status (*check_job)(const dopt_job*) = nullptr;  ///< ABI 1.2, optional (job.h)
  /// ABI 1.4: DOPT_DEVICE_BIT of each DLDeviceType whose memory it accepts
  /// (DOPT_DEVICES_DEFAULT, kDLCPU only, when it declares none).
  uint32_t devices = DOPT_DEVICES_DEFAULT;
  std::shared_ptr<void> library;  ///< keeps the .so loaded while any copy lives
};

/// ABI 1.3: a component chosen inside another's YAML section (a reducer's
/// `inner:`), with its options validated against its own schema. Keeps its
/// library loaded (info.library) while it lives.
struct InnerComponent {
  ComponentInfo info;
  Options options;
};

/// A library that was not loaded, and why (names the file).
struct SkippedPlugin {
  std::string file;
  std::string reason;
};

const char* kind_name(dopt_component_kind kind);  ///< "communicator", "reducer", "algorithm"

/// DLPack's name of a device type: "kDLCPU", "kDLCUDA", "kDLCUDAHost", ...;
/// "device type N" for one this DLPack does not name.
std::string dl_device_name(int32_t device_type);
/// The device types of a ComponentInfo::devices set, in type order:
/// "kDLCPU, kDLCUDA".
std::string devices_text(uint32_t devices);

/// Discovers plugins in directories. Loading validates: the entry symbol
/// dopt_plugin_init_v1 exists; the ABI major equals the host's (a newer minor
/// loads); struct sizes are at least the v1.0 sizes (the components and
/// option arrays are walked with the plugin's sizeof: that of the ABI minor
/// it declares, or its struct_size when larger); every required vtable
/// function is non-NULL (naming the missing field); component names are
/// unique per kind (a later duplicate is skipped naming both files). A library
/// failing any check is skipped, the others still load. Not thread-safe.
class PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();

  /// Load every regular file ending in .so in each directory (non-recursive,
  /// sorted by name). Missing directories are ignored.
  void discover(const std::vector<std::string>& dirs);
  /// Load one library file; returns false (and records why) if skipped.
  bool load_file(const std::string& path);

  const std::vector<ComponentInfo>& components() const { return components_; }
  const std::vector<SkippedPlugin>& skipped() const { return skipped_; }

  /// The component of this kind and name, or nullptr.
  const ComponentInfo* find(dopt_component_kind kind, const std::string& name) const;
  /// Like find, but throws PluginError naming the kind and name, the
  /// available names, and every skipped library with its reason.
  const ComponentInfo& get(dopt_component_kind kind, const std::string& name) const;

  /// The search order, the same for every command and for Runtime:
  /// `cli_paths` (--plugin-path / -P), then `config_paths` (YAML
  /// plugins.paths), then each entry of $DISTOPT_PLUGIN_PATH (':'-separated),
  /// then, when this libdistopt_core is the one in its build tree, that
  /// tree's plugins/ directory, then <libdir of this
  /// libdistopt_core>/distopt/plugins (a relocated install), then the
  /// configured install prefix's <libdir>/distopt/plugins. Duplicates
  /// dropped; the first file that provides a component name wins.
  static std::vector<std::string> search_path(const std::vector<std::string>& cli_paths,
                                              const std::vector<std::string>& config_paths);
  /// search_path({}, config_paths).
  static std::vector<std::string> search_path(const std::vector<std::string>& config_paths) {
    return search_path({}, config_paths);
  }

 private:
  std::vector<ComponentInfo> components_;
  std::vector<SkippedPlugin> skipped_;
};

}  // namespace distopt
