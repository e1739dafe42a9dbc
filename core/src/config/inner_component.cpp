// ABI 1.3 inner reducers: validating `reducer.inner` at check time.
#include "config/inner_component.hpp"

#include <memory>
#include <vector>

#include "base/yaml_util.hpp"
#include "config/job_check.hpp"
#include "distopt/error.hpp"

namespace distopt::config {

using namespace yaml;

namespace {

// Where `key` (below the section) is written, else where the inner starts.
YAML::Mark inner_mark(const JobConfig& cfg, const ComponentConfig& inner, const std::string& key) {
  YAML::Mark m = mark_of_key(cfg.root, key);
  return m.is_null() ? inner.mark : m;
}

}  // namespace

void attach_inner_reducer(const JobConfig& cfg, const ComponentConfig& section,
                          const std::string& path, const PluginRegistry& registry,
                          const ComponentInfo& outer, Options& options) {
  if (!section.inner) return;
  const ComponentConfig& inner = *section.inner;
  const std::string where = path + ".inner";
  if (!(outer.traits & DOPT_TRAIT_WRAPS_REDUCER))
    fail(cfg.path, inner.mark,
         where + ": reducer '" + outer.name + "' (plugin " + outer.plugin_name +
             ") does not wrap another reducer; only a reducer that declares it (e.g. "
             "hierarchical) takes `inner:`. Remove `inner:`, or select the inner reducer as " +
             path + ".name");
  const ComponentInfo* info = registry.find(DOPT_KIND_REDUCER, inner.name);
  if (!info) {
    const YAML::Mark m = inner_mark(cfg, inner, where + ".name");
    try {
      registry.get(DOPT_KIND_REDUCER, inner.name);  // throws naming what there is
    } catch (const PluginError& e) {
      fail(cfg.path, m, where + ".name: " + e.what());
    }
    fail(cfg.path, m, where + ".name: no reducer named '" + inner.name + "'");
  }
  const std::string opt_where = where + ".options";
  if (!inner.options.IsDefined() || inner.options.IsNull())
    for (const auto& s : info->options)
      if (!s.default_value)
        fail(cfg.path, inner.mark,
             opt_where + ": missing required option '" + s.name + "'" +
                 (s.help.empty() ? "" : " (" + s.help + ")"));
  auto nested = std::make_shared<InnerComponent>();
  nested->info = *info;
  nested->options = Options::validate(inner.options, info->options, cfg.path, opt_where);
  options.set_inner(std::move(nested));
}

uint32_t effective_traits(const ComponentInfo& info, const Options& options) {
  uint32_t t = info.traits;
  if (const InnerComponent* in = options.inner(); in && !(in->info.traits & DOPT_TRAIT_EXACT_MEAN))
    t &= ~DOPT_TRAIT_EXACT_MEAN;
  return t;
}

}  // namespace distopt::config
