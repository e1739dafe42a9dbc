// Private: ABI 1.3 inner reducers. A reducer that declares
// DOPT_TRAIT_WRAPS_REDUCER may name another reducer in its section's
// `inner: {name, options}`; the host resolves and validates it like any
// section and hangs it on the outer's validated Options, where the host
// services dopt_host_api::inner_reducer / create_inner_reducer find it.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/component_options.hpp"
#include "distopt/config.hpp"
#include "distopt/registry.hpp"

namespace distopt::config {

/// Resolve and validate `section.inner` (if any) and attach it to `options`
/// (the outer reducer's validated options). `path` is the section's dotted
/// YAML path ("reducer"), for messages and marks. Throws ConfigError at
/// FILE:LINE:COLUMN for: `inner:` under a reducer without
/// DOPT_TRAIT_WRAPS_REDUCER (at the `inner` key), an unknown inner name
/// (listing the reducers there are), an inner option that its schema
/// refuses (as any option: unknown key, type, range, required).
void attach_inner_reducer(const JobConfig& cfg, const ComponentConfig& section,
                          const std::string& path, const PluginRegistry& registry,
                          const ComponentInfo& outer, Options& options);

/// The traits the host reports for a reducer: its own, without
/// DOPT_TRAIT_EXACT_MEAN when it has an inner reducer that does not declare
/// it (abi.h, DOPT_TRAIT_WRAPS_REDUCER).
uint32_t effective_traits(const ComponentInfo& info, const Options& options);

}  // namespace distopt::config
