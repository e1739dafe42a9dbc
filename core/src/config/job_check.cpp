// The ABI 1.2 job check (distopt/job.h): builds the dopt_job view of a
// validated job, calls each selected component's check_job, and turns a
// refusal into a ConfigError at the YAML key the component names.
#include "config/job_check.hpp"

#include <new>
#include <type_traits>

#include "base/services.hpp"
#include "base/yaml_util.hpp"
#include "config/inner_component.hpp"
#include "distopt/error.hpp"
#include "distopt/job.h"
#include "distopt/precision.hpp"

namespace distopt::config {
namespace {

using namespace yaml;

struct Verdict {
  bool rejected = false;
  std::string key, message;
};

// The view the plugin gets, followed by what reject() writes to: the
// callback finds the Verdict from the dopt_job pointer (first member of a
// standard-layout struct).
struct HostJob {
  dopt_job job;
  Verdict* verdict;
};
static_assert(std::is_standard_layout_v<HostJob>, "reject() casts dopt_job* back to HostJob*");

void reject_cb(const dopt_job* job, const char* key, const char* message) noexcept {
  if (!job) return;
  Verdict* v = reinterpret_cast<const HostJob*>(job)->verdict;
  if (!v || v->rejected) return;  // the first reason names the problem
  try {
    v->key = key ? key : "";
    v->message = message ? message : "";
    v->rejected = true;
  } catch (const std::bad_alloc&) {
    v->rejected = true;  // keep the refusal; lose the words
  }
}

// A dopt_job_component with the arrays it points to.
struct ComponentView {
  dopt_job_component c{};
  std::vector<const char*> names;
  std::vector<int32_t> types;  // dopt_option_type values

  void fill(const CheckedComponent& cc) {
    const ComponentInfo& ci = *cc.info;
    for (const auto& s : *cc.schema) {
      names.push_back(s.name.c_str());
      types.push_back(s.type);
    }
    c.struct_size = DOPT_JOB_COMPONENT_V1_3_STRUCT_SIZE;
    c.ext = nullptr;
    c.kind = ci.kind;
    c.name = ci.name.c_str();
    c.version = ci.version.c_str();
    c.plugin_name = ci.plugin_name.c_str();
    c.plugin_file = ci.file.c_str();
    c.abi_minor = ci.abi_minor;
    c.traits = effective_traits(ci, *cc.options);
    c.options = cc.options->c_handle();
    c.option_names = names.empty() ? nullptr : names.data();
    c.option_types = types.empty() ? nullptr : types.data();
    c.num_options = names.size();
    c.inner = nullptr;
  }
};

// An inner reducer names its keys as the top-level reducer would
// ("reducer.options.rank"): they are the section's `inner:` (job.h).
std::string inner_key(const std::string& key) {
  if (key.empty() || key == "reducer") return "reducer.inner";
  if (key.rfind("reducer.", 0) == 0) return "reducer.inner." + key.substr(8);
  return key;
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= key.size()) {
    size_t dot = key.find('.', start);
    if (dot == std::string::npos) dot = key.size();
    parts.push_back(key.substr(start, dot - start));
    start = dot + 1;
  }
  return parts;
}

}  // namespace

YAML::Mark mark_of_key(const YAML::Node& root, const std::string& key) {
  YAML::Mark best = YAML::Mark::null_mark();
  YAML::Node node = root;
  for (const auto& part : split_key(key)) {
    if (!node.IsDefined() || !node.IsMap()) return best;
    YAML::Node k, v;
    bool found = false;
    for (const auto& kv : node) {
      const YAML::Node kn = kv.first;
      if (kn.IsScalar() && kn.Scalar() == part) {
        k = kn;
        v = kv.second;
        found = true;
        break;
      }
    }
    if (!found) return best;
    best = mark_of(k, best);
    // A scalar value is what the message is about ("stage: 2" -> the 2); a
    // section is named where its key is written.
    if (v.IsDefined() && v.IsScalar()) best = mark_of(v, best);
    node = v;
  }
  return best;
}

void check_job_with_components(const JobConfig& cfg, int64_t world_size,
                               const CheckedComponent& communicator,
                               const CheckedComponent& reducer, const CheckedComponent& algorithm,
                               const Options& optimizer_options,
                               const std::vector<OptionSpec>& optimizer_schema) {
  // ABI 1.3: the reducer's inner (if any) is asked right after the reducer.
  const InnerComponent* inner = reducer.options->inner();
  const CheckedComponent inner_cc{inner ? &inner->info : nullptr, inner ? &inner->options : nullptr,
                                  inner ? &inner->info.options : nullptr};
  const CheckedComponent* order[] = {&communicator, &reducer, &algorithm, &inner_cc};
  const int n = inner ? 4 : 3;
  bool any = false;
  for (int i = 0; i < n; ++i) any = any || order[i]->info->check_job;
  if (!any) return;

  ComponentView views[4];
  for (int i = 0; i < n; ++i) views[i].fill(*order[i]);
  if (inner) views[1].c.inner = &views[3].c;
  std::vector<const char*> opt_names;
  std::vector<int32_t> opt_types;  // dopt_option_type values
  for (const auto& s : optimizer_schema) {
    opt_names.push_back(s.name.c_str());
    opt_types.push_back(s.type);
  }

  Verdict verdict;
  HostJob host{};
  host.verdict = &verdict;
  dopt_job& j = host.job;
  j.struct_size = DOPT_JOB_STRUCT_SIZE;
  j.ext = nullptr;
  j.file = cfg.path.c_str();
  j.world_size = static_cast<int32_t>(world_size > 0 ? world_size : cfg.world_size);
  j.communicator = &views[0].c;
  j.reducer = &views[1].c;
  j.algorithm = &views[2].c;
  j.optimizer_name = cfg.optimizer_name.c_str();
  j.optimizer_options = optimizer_options.c_handle();
  j.optimizer_option_names = opt_names.empty() ? nullptr : opt_names.data();
  j.optimizer_option_types = opt_types.empty() ? nullptr : opt_types.data();
  j.num_optimizer_options = opt_names.size();
  j.precision_dtype = precision_dtype_name(cfg.precision.dtype);
  j.reject = &reject_cb;

  for (int i : {0, 1, 3, 2}) {  // communicator, reducer, its inner, algorithm
    if (i >= n) continue;
    const ComponentInfo& ci = *order[i]->info;
    if (!ci.check_job) continue;
    j.self = &views[i].c;
    verdict = Verdict{};
    take_last_error();
    dopt_status st = DOPT_ERR_INTERNAL;
    try {
      st = ci.check_job(&j);
    } catch (...) {  // the ABI says noexcept; refuse rather than crash
      st = DOPT_ERR_INTERNAL;
      if (!verdict.rejected) {
        verdict.rejected = true;
        verdict.message = "check_job threw a C++ exception across the C ABI (" + ci.file + ")";
      }
    }
    const std::string detail = take_last_error();
    if (st >= 0) continue;
    const std::string section = kind_name(ci.kind);
    std::string key = verdict.rejected && !verdict.key.empty() ? verdict.key : section;
    if (i == 3) key = inner_key(key);
    std::string why = verdict.rejected && !verdict.message.empty() ? verdict.message : detail;
    if (why.empty()) why = std::string("refused (") + dopt_status_string(st) + ") without a reason";
    fail(cfg.path, mark_of_key(cfg.root, key),
         key + ": " + (i == 3 ? "inner reducer" : section) + " '" + ci.name +
             "' refuses this job: " + why);
  }
}

}  // namespace distopt::config
