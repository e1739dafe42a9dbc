// The job as a component sees it at check time (ABI 1.2, distopt/job.h), in
// C++: give a component class a static check_job and it can refuse a job
// before anything is created, at the YAML key the user has to change:
//
//   class MyAlgorithm : public distopt::sdk::Algorithm {
//    public:
//     static void check_job(const distopt::sdk::JobView& job) {
//       if (job.optimizer_name() != "sgd")
//         job.reject("optimizer.name", "my_algo implements SGD only, got " +
//                                          job.optimizer_name());
//       if (job.self().options().get_int("stage") == 2 &&
//           !job.reducer().has_trait(DOPT_TRAIT_EXACT_MEAN))
//         job.reject("algorithm.options.stage", "stage 2 averages the gradients itself ...");
//     }
//     ...
//   };
//
// DOPT_COMPONENT(...) finds it (and `static constexpr uint32_t traits =
// DOPT_TRAIT_...;`, the properties the class declares) and fills
// dopt_component::check_job / ::traits; a class without them accepts every
// job and declares nothing. check_job runs with no instance, may run several
// times per process and on several threads at once: keep it a pure function
// of the view. Torch-free, header-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distopt/abi.h"
#include "distopt/job.h"
#include "distopt/sdk/base/host.hpp"
#include "distopt/sdk/base/options.hpp"

namespace distopt::sdk {

/// What JobView::reject throws: the job is refused because of the YAML
/// setting `key` ("algorithm.options.stage"). The generated glue hands key
/// and message to the host and returns its status (INVALID_ARGUMENT unless
/// given another, e.g. DOPT_ERR_UNSUPPORTED).
class JobRejected : public Error {
 public:
  JobRejected(std::string key, const std::string& message,
              dopt_status status = DOPT_ERR_INVALID_ARGUMENT)
      : Error(status, message), key_(std::move(key)) {}
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

/// One selected component of the job (dopt_job_component). Valid during the
/// check_job call only, like the view it came from.
class JobComponentView {
 public:
  explicit JobComponentView(const dopt_job_component* c) : c_(c) {}

  dopt_component_kind kind() const { return static_cast<dopt_component_kind>(c_->kind); }
  std::string name() const { return str(c_->name); }
  std::string version() const { return str(c_->version); }
  /// The plugin that provides it ("compress" for topk).
  std::string plugin() const { return str(c_->plugin_name); }
  std::string plugin_file() const { return str(c_->plugin_file); }
  /// The ABI minor its plugin was built against (0 and 1 declare no traits).
  uint32_t abi_minor() const { return c_->abi_minor; }
  uint32_t traits() const { return c_->traits; }
  /// True if it declares every bit of `t` (DOPT_TRAIT_EXACT_MEAN, ...).
  bool has_trait(uint32_t t) const { return (c_->traits & t) == t; }
  /// Its validated options (defaults filled in), read as in a constructor.
  OptionsView options() const { return OptionsView(c_->options); }
  bool has_option(const std::string& name) const {
    for (size_t i = 0; i < c_->num_options; ++i)
      if (c_->option_names[i] && name == c_->option_names[i]) return true;
    return false;
  }
  std::vector<std::string> option_names() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < c_->num_options; ++i) out.push_back(str(c_->option_names[i]));
    return out;
  }
  /// ABI 1.3: whether this section has an `inner:` reducer (false on a
  /// host older than 1.3, which has no inner reducers).
  bool has_inner() const {
    return c_->struct_size >= DOPT_JOB_COMPONENT_V1_3_STRUCT_SIZE && c_->inner != nullptr;
  }
  /// The `inner:` reducer (check has_inner() first; throws
  /// sdk::Error(INVALID_ARGUMENT) when there is none).
  JobComponentView inner() const {
    if (!has_inner()) throw Error(DOPT_ERR_INVALID_ARGUMENT, "the section has no inner reducer");
    return JobComponentView(c_->inner);
  }
  const dopt_job_component& c() const { return *c_; }

 private:
  static std::string str(const char* s) { return s ? std::string(s) : std::string(); }
  const dopt_job_component* c_;
};

/// The whole validated job (dopt_job): the three components with their
/// options, the inner optimizer, world size and precision.
class JobView {
 public:
  explicit JobView(const dopt_job& job) : j_(&job) {}

  /// The job file, for messages (the host adds file:line:column itself).
  std::string file() const { return j_->file ? j_->file : ""; }
  /// The launcher's rank count (train / Runtime), world.size (`distopt check`).
  int32_t world_size() const { return j_->world_size; }
  /// The component being asked (its own options: self().options()).
  JobComponentView self() const { return JobComponentView(j_->self); }
  JobComponentView communicator() const { return JobComponentView(j_->communicator); }
  JobComponentView reducer() const { return JobComponentView(j_->reducer); }
  JobComponentView algorithm() const { return JobComponentView(j_->algorithm); }
  /// optimizer.name ("sgd", "adam", ...) and its validated options.
  std::string optimizer_name() const { return j_->optimizer_name ? j_->optimizer_name : ""; }
  OptionsView optimizer() const { return OptionsView(j_->optimizer_options); }
  bool optimizer_has(const std::string& name) const {
    for (size_t i = 0; i < j_->num_optimizer_options; ++i)
      if (j_->optimizer_option_names[i] && name == j_->optimizer_option_names[i]) return true;
    return false;
  }
  /// precision.dtype: "fp32" (off), "bf16" or "fp16".
  std::string precision_dtype() const { return j_->precision_dtype ? j_->precision_dtype : ""; }

  /// Refuse the job because of the YAML setting `key` (dotted, as written in
  /// the file: "algorithm.options.stage", "reducer.name", "optimizer.name",
  /// "optimizer.momentum"; "" = this component's section). `message` says
  /// why and what to use instead; the host prefixes file:line:column, the
  /// key, and this component's kind and name. Throws JobRejected.
  [[noreturn]] void reject(const std::string& key, const std::string& message,
                           dopt_status status = DOPT_ERR_INVALID_ARGUMENT) const {
    throw JobRejected(key, message, status);
  }

  const dopt_job& c() const { return *j_; }

 private:
  const dopt_job* j_;
};

}  // namespace distopt::sdk
