// `distopt plugins`: what plugin discovery found (kind, name, version, ABI,
// file, option schemas) and what it skipped, and why.
#include <sys/stat.h>

#include <boost/program_options.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/host_api.hpp"
#include "distopt/registry.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace {

// stat(2), not std::filesystem: see tools/check_symbols.sh for why.
bool is_directory(const std::string& d) {
  struct stat st {};
  return ::stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

/// "[0, 10]", "(0, 1]", "[1, inf)" for a ranged number, "fast|slow" for
/// choices, "" otherwise.
std::string constraint(const distopt::OptionSpec& s) {
  if (!s.choices.empty()) return join(s.choices, "|");
  return s.range_text();
}

/// What a component declares beyond its options (ABI 1.2), "" for nothing.
std::string declarations(const distopt::ComponentInfo& c) {
  std::vector<std::string> parts;
  if (c.traits & DOPT_TRAIT_EXACT_MEAN) parts.push_back("reduces to the exact mean");
  if (c.traits & DOPT_TRAIT_WRAPS_REDUCER) parts.push_back("wraps an `inner:` reducer");
  if (c.check_job) parts.push_back("checks the whole job at `distopt check`");
  if (c.devices != DOPT_DEVICES_DEFAULT)  // ABI 1.4
    parts.push_back("memory on " + distopt::devices_text(c.devices));
  return join(parts, "; ");
}

/// ["kDLCPU", "kDLCUDA"] for a ComponentInfo::devices set (ABI 1.4).
json devices_json(uint32_t devices) {
  json out = json::array();
  for (int32_t t = 0; t < 32; ++t)
    if (devices & DOPT_DEVICE_BIT(t)) out.push_back(distopt::dl_device_name(t));
  return out;
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
void print_table(std::ostream& os, const std::vector<std::vector<std::string>>& rows,
                 const std::string& indent) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t i = 0; i < r.size(); ++i)
      line += i + 1 < r.size() ? r[i] + std::string(w[i] - r[i].size() + 2, ' ') : r[i];
    os << line << "\n";
  }
}

json options_json(const std::vector<distopt::OptionSpec>& specs) {
  json arr = json::array();
  for (const auto& s : specs) {
    json o = {{"name", s.name}, {"type", distopt::option_type_name(s.type)}, {"help", s.help}};
    o["default"] = s.default_value ? json(*s.default_value) : json(nullptr);
    o["required"] = !s.default_value.has_value();
    if (s.has_range()) {
      o["range"] = {distopt::format_option_number(s.min_value),
                    distopt::format_option_number(s.max_value)};  // text: JSON has no inf
      o["interval"] = s.range_text();                             // "(0, 1]"
      o["min_exclusive"] = s.min_exclusive;
      o["max_exclusive"] = s.max_exclusive;
    }
    if (!s.choices.empty()) o["choices"] = s.choices;
    arr.push_back(o);
  }
  return arr;
}

void print_options(std::ostream& os, const std::vector<distopt::OptionSpec>& specs) {
  std::vector<std::vector<std::string>> rows = {
      {"OPTION", "TYPE", "DEFAULT", "RANGE/CHOICES", "HELP"}};
  for (const auto& s : specs)
    rows.push_back({s.name, distopt::option_type_name(s.type),
                    s.default_value ? *s.default_value : "(required)", constraint(s), s.help});
  print_table(os, rows, "    ");
}

/// `distopt plugins --json`: the search path, the components with their
/// options, the core bucketing options and the skipped files.
json discovery_json(const std::vector<std::string>& dirs, const distopt::PluginRegistry& reg) {
  json out;
  out["search_path"] = json::array();
  for (const auto& d : dirs)
    out["search_path"].push_back({{"dir", d}, {"exists", is_directory(d)}});
  out["components"] = json::array();
  for (const auto& c : reg.components())
    out["components"].push_back(
        {{"kind", distopt::kind_name(c.kind)},
         {"name", c.name},
         {"version", c.version},
         {"description", c.description},
         {"plugin", c.plugin_name},
         {"plugin_version", c.plugin_version},
         {"abi", std::to_string(c.abi_major) + "." + std::to_string(c.abi_minor)},
         {"file", c.file},
         {"traits",
          {{"exact_mean", (c.traits & DOPT_TRAIT_EXACT_MEAN) != 0},
           {"wraps_reducer", (c.traits & DOPT_TRAIT_WRAPS_REDUCER) != 0}}},
         {"checks_job", c.check_job != nullptr},
         {"devices", devices_json(c.devices)},
         {"options", options_json(c.options)}});
  out["reducer_bucket_options"] = options_json(distopt::bucket_option_specs());
  out["skipped"] = json::array();
  for (const auto& s : reg.skipped())
    out["skipped"].push_back({{"file", s.file}, {"reason", s.reason}});
  return out;
}

/// The "Components" table, then each component's description, declarations
/// and options, then the bucketing options if any reducer was found.
void print_components(std::ostream& os, const distopt::PluginRegistry& reg) {
  os << "\nComponents (" << reg.components().size() << "):\n";
  if (reg.components().empty()) {
    os << "  (none found)\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"KIND", "NAME", "VERSION", "ABI", "FILE"}};
    for (const auto& c : reg.components())
      rows.push_back({distopt::kind_name(c.kind), c.name, c.version,
                      std::to_string(c.abi_major) + "." + std::to_string(c.abi_minor), c.file});
    print_table(os, rows, "  ");
  }

  for (const auto& c : reg.components()) {
    os << "\n" << distopt::kind_name(c.kind) << " " << c.name;
    if (!c.description.empty()) os << ": " << c.description;
    os << "\n";
    if (std::string d = declarations(c); !d.empty()) os << "    (" << d << ")\n";
    if (c.options.empty())
      os << "    (no options of its own)\n";
    else
      print_options(os, c.options);
  }
  bool any_reducer = false;
  for (const auto& c : reg.components()) any_reducer = any_reducer || c.kind == DOPT_KIND_REDUCER;
  if (any_reducer) {
    os << "\nEvery reducer also takes the core bucketing options:\n";
    print_options(os, distopt::bucket_option_specs());
  }
}

/// `distopt plugins` as tables: search path, components, skipped files.
void print_discovery(std::ostream& os, const std::vector<std::string>& dirs,
                     const distopt::PluginRegistry& reg) {
  os << "Search path:\n";
  for (const auto& d : dirs)
    os << "  " << d << (is_directory(d) ? "" : "  (does not exist)") << "\n";
  print_components(os, reg);
  os << "\nSkipped (" << reg.skipped().size() << "):\n";
  if (reg.skipped().empty()) os << "  (none)\n";
  for (const auto& s : reg.skipped()) os << "  " << s.file << ": " << s.reason << "\n";
}

int run_plugins(int argc, char** argv) {
  po::options_description desc(
      "usage: distopt plugins [--plugin-path DIR]... [--config JOB.yaml] [--json]\n\n"
      "List the components found by plugin discovery (searched in order: the job's\n"
      "--plugin-path, plugins.paths, $DISTOPT_PLUGIN_PATH, the build tree, the install dir), "
      "their\n"
      "options, and the plugin files that were skipped with the reason.\n\noptions");
  desc.add_options()("help,h", "show this help")("plugin-path,P",
                                                 po::value<std::vector<std::string>>()->composing(),
                                                 "search DIR first (repeatable)")(
      "config,c", po::value<std::string>(), "use the plugins.paths of this job file")(
      "json", "print JSON instead of tables");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt plugins: " << e.what() << "\n\n" << desc << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }

  std::vector<std::string> config_paths;
  if (vm.count("config"))
    config_paths = distopt::load_job_config(vm["config"].as<std::string>()).plugin_paths;
  std::vector<std::string> cli_paths;
  if (vm.count("plugin-path")) cli_paths = vm["plugin-path"].as<std::vector<std::string>>();
  std::vector<std::string> dirs = distopt::PluginRegistry::search_path(cli_paths, config_paths);

  // Skipped files are part of this command's output: no warning lines too.
  distopt::set_log_level(DOPT_LOG_ERROR);
  distopt::PluginRegistry reg;
  reg.discover(dirs);

  if (vm.count("json"))
    std::cout << discovery_json(dirs, reg).dump(2) << "\n";
  else
    print_discovery(std::cout, dirs, reg);
  return 0;
}

}  // namespace

DISTOPT_REGISTER_COMMAND("plugins",
                         "list discovered plugin components, their options, and skipped files",
                         run_plugins);
