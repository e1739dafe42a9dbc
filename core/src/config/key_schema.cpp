// The key tables of the job file's sections (distopt/key_schema.hpp). Adding
// a key the parser accepts is one row here plus its parsing in config.cpp;
// `distopt config reference` and share/doc/distopt/REFERENCE.md follow.
// A row is the one place a key's type, range and help are written: the
// parser reads a number's range and a name's choices from it
// (config/key_range.hpp); its default is printed from the public struct's
// member initializer. tests/config/key_schema_test.cpp checks both ends of
// each range against the parser, and that each default parses.
#include "distopt/key_schema.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <limits>
#include <stdexcept>

#include "base/yaml_util.hpp"
#include "config/key_range.hpp"
#include "distopt/buckets.hpp"
#include "distopt/config.hpp"

namespace distopt {

namespace {

// A key's default is its public struct's member initializer (config.hpp,
// precision.hpp, lr_schedule.hpp), printed here, so it is written once; the
// texts live as long as the tables (built once).
const char* text(const std::string& v) {
  static std::deque<std::string> texts;
  texts.push_back(v);
  return texts.back().c_str();
}
const char* text(int64_t v) { return text(std::to_string(v)); }
const char* text(double v) { return text(yaml::format_number(v)); }
const char* text(bool v) { return v ? "true" : "false"; }
const JobConfig& job() {
  static const JobConfig d;
  return d;
}
const LrSchedule& schedule() {
  static const LrSchedule d;
  return d;
}

// Integers written as "no upper bound" are capped at 2^40 by the parser.
#define DOPT_HUGE "1099511627776"

// The help of a component section's two keys.
constexpr const char* kComponentName = "name of a discovered component (`distopt plugins`)";
constexpr const char* kComponentOptions =
    "the component's own options (its schema: `distopt plugins`, or Components below)";

// One table per group of sections, in the reference's order.

// The top level, plugins and world: where the job's parts come from.
std::vector<SectionSchema> job_sections() {
  return {
      {"the top level",
       "the sections of a job file; every one is optional, an empty file is an error",
       {
           {"plugins", "map", "(every default)", "", "where to look for plugin files"},
           {"world", "map", "(every default)", "", "ranks, rendezvous and timeouts"},
           {"communicator", "component", "tcp", "", "moves the gradient buckets between ranks"},
           {"control_communicator", "component", "(the communicator, or tcp)", "",
            "host-memory collectives beside a device-only communicator"},
           {"reducer", "component", "mean", "", "reduces one gradient bucket across ranks"},
           {"algorithm", "component", "allreduce", "",
            "owns the optimizer step (update rule, state, parameter sync)"},
           {"optimizer", "map or name", "sgd", "", "the inner update rule and its options"},
           {"train", "map", "(every default)", "", "what `distopt train` trains, and how long"},
           {"precision", "map", "(fp32, off)", "", "mixed precision and loss scaling"},
           {"buffers", "map", "(every default)", "",
            "how module buffers (BatchNorm statistics) stay equal across ranks"},
           {"join", "map", "(every default)", "", "uneven inputs (DistributedOptimizer::join)"},
           {"elastic", "map", "(off)", "",
            "go on with the survivors when a rank dies (in-memory commits)"},
           {"app", "any", "(none)", "",
            "the program's own settings; not validated (Runtime::config().app)"},
           {"schedule", "list of phases", "(one phase)", "",
            "switch algorithm and reducer during training"},
           {"autotune", "map", "(off)", "",
            "search bucket_cap_mb, overlap and mean/hierarchical during the first steps"},
       }},
      {"plugins",
       "plugin search path (searched after --plugin-path, before $DISTOPT_PLUGIN_PATH, the "
       "build tree and <libdir>/distopt/plugins)",
       {
           {"paths", "list of strings", "[]", "",
            "directories searched for plugins, relative to the job file"},
       }},
      {"world",
       "ranks and rendezvous; a launcher's environment (distopt launch, torchrun, Slurm, Open "
       "MPI) takes precedence",
       {
           {"size", "int", text(job().world_size), "[1, 1048576]",
            "ranks started on this host by `distopt train` / `distopt launch`"},
           {"rendezvous", "string", text(job().rendezvous), "tcp://HOST:PORT|env://|file://PATH",
            "where the ranks meet (env://: MASTER_ADDR, MASTER_PORT)"},
           {"timeout_s", "double", text(job().timeout_s), "(0, 1e9]",
            "rendezvous and default operation timeout, seconds"},
           {"collective_check_s", "double", text(job().collective_check_s), "[0, 1e9]",
            "a collective waiting this long makes the ranks compare what they wait on (0 = off)"},
           {"watchdog_s", "double", text(job().watchdog_s), "[0, 1e9]",
            "a call into a component (a step, a collective) running this long ends the rank, "
            "naming the component and the operation (0 = twice timeout_s)"},
       }},
  };
}

// The components: communicators, reducer, algorithm.
std::vector<SectionSchema> component_sections() {
  return {
      {"communicator",
       "`{name, options}`, or the name alone (`communicator: ucx`)",
       {
           {"name", "string", text(job().communicator.name), "", kComponentName},
           {"options", "map", "{}", "", kComponentOptions},
       }},
      {"control_communicator",
       "as communicator; set only when the job's communicator cannot carry host memory "
       "(default: tcp over the same rendezvous)",
       {
           {"name", "string", "(none)", "", kComponentName},
           {"options", "map", "{}", "", kComponentOptions},
       }},
      {"reducer",
       "`{name, options, inner}`, or the name alone; `options` also holds the bucketing options "
       "(bucket_cap_mb, align_bytes, overlap: Components below), which the host's bucket "
       "manager reads and the reducer never sees",
       {
           {"name", "string", text(job().reducer.name), "", kComponentName},
           {"options", "map", "{}", "", kComponentOptions},
           {"inner", "component", "(none)", "",
            "the reducer a wrapping reducer (e.g. hierarchical) delegates to; one level deep"},
       }},
      {"reducer.inner",
       "`{name, options}` of the wrapped reducer; takes no `inner:` of its own",
       {
           {"name", "string", "(required)", "", kComponentName},
           {"options", "map", "{}", "", kComponentOptions},
       }},
      {"algorithm",
       "`{name, options}`, or the name alone (`algorithm: zero`)",
       {
           {"name", "string", text(job().algorithm.name), "", kComponentName},
           {"options", "map", "{}", "", kComponentOptions},
       }},
  };
}

// The inner optimizer and its learning-rate schedule.
std::vector<SectionSchema> optimizer_sections() {
  return {
      {"optimizer",
       "`{name, <its options>}` or the name alone (`optimizer: adam`); the options of each "
       "optimizer follow",
       {
           {"name", "string", text(job().optimizer_name), "sgd|adam|adamw|adagrad|rmsprop",
            "the inner update rule (libtorch's optimizer of that name)"},
           {"lr_schedule", "map or name", "(none: constant)", "",
            "learning-rate schedule, each group's lr x factor(step) (optimizer.lr_schedule "
            "below; lr-schedule-and-clipping.md)"},
           {"grad_clip", "double", text(job().grad_clip), "[0, inf)",
            "max global L2 norm of the reduced gradient before the update, for every algorithm "
            "(0 = off; torch.nn.utils.clip_grad_norm_)"},
       }},
      {"optimizer.lr_schedule",
       "`{name, <its keys>}` or the name alone (`lr_schedule: cosine`); units are optimizer steps",
       {
           {"name", "string", "constant", "constant|step|multi_step|cosine|linear|one_cycle",
            "the factor's shape (PyTorch's StepLR, MultiStepLR, CosineAnnealingLR, LinearLR, "
            "OneCycleLR)"},
           {"kind", "string", "constant", "constant|step|multi_step|cosine|linear|one_cycle",
            "alias of name (the older spelling)"},
           {"warmup_steps", "int", text(schedule().warmup_steps), "[0, " DOPT_HUGE "]",
            "step, multi_step, cosine, linear: linear warm-up steps first"},
           {"warmup_start_factor", "double", text(schedule().warmup_start_factor), "[0, 1]",
            "the factor at step 0 of the warm-up"},
           {"step_size", "int", text(schedule().step_size), "[1, " DOPT_HUGE "]",
            "step: steps per decay"},
           {"gamma", "double", text(schedule().gamma), "(0, inf)",
            "step, multi_step: decay factor"},
           {"milestones", "list of int", "(required)", "strictly increasing, > 0",
            "multi_step: steps at which the factor is multiplied by gamma"},
           {"total_steps", "int", "(distopt train: epochs x steps per epoch)", "[1, " DOPT_HUGE "]",
            "cosine, linear, one_cycle: length, warm-up included"},
           {"min_lr_factor", "double", text(schedule().min_lr_factor), "[0, 1]",
            "cosine: the final factor"},
           {"end_factor", "double", text(schedule().end_factor), "[0, 1]",
            "linear: the final factor"},
           {"pct_start", "double", text(schedule().pct_start), "(0, 1)",
            "one_cycle: fraction of steps rising"},
           {"div_factor", "double", text(schedule().div_factor), "(0, inf)",
            "one_cycle: peak / initial lr"},
           {"final_div_factor", "double", text(schedule().final_div_factor), "(0, inf)",
            "one_cycle: initial / final lr"},
           {"anneal", "string", schedule().anneal_cos ? "cos" : "linear", "cos|linear",
            "one_cycle: anneal strategy"},
       }},
  };
}

// What `distopt train` trains.
std::vector<SectionSchema> train_sections() {
  return {
      {"train",
       "`distopt train`'s model, data and loop (a program that embeds the runtime ignores it)",
       {
           {"model", "string", text(job().train.model), "mlp|cnn|resnet",
            "a built-in model (Models below), or `{torchscript: PATH}` (train.model below)"},
           {"model_width", "int", text(job().train.model_width), "[0, 4096]",
            "resnet's base channels; 0 = 8 on the CPU, 64 (ResNet-18) on a GPU"},
           {"dataset", "string", text(job().train.dataset), "fashion-mnist|synthetic|tensors",
            "fashion-mnist from data_dir, images generated from their index, or tensors saved "
            "from Python (train.tensors)"},
           {"synthetic", "map", "(every default)", "", "the generated dataset's size and shape"},
           {"tensors", "map", "(required by dataset: tensors)", "",
            "the files of `dataset: tensors` (train.tensors below)"},
           {"data_dir", "string", text(job().train.data_dir), "",
            "directory of the Fashion-MNIST IDX files (gzip'd or not)"},
           {"epochs", "int", text(job().train.epochs), "[1, " DOPT_HUGE "]",
            "passes over the training set"},
           {"batch_size", "int", text(job().train.batch_size), "[1, " DOPT_HUGE "]",
            "samples per step, per rank"},
           {"global_batch_size", "int", text(job().train.global_batch_size), "[0, " DOPT_HUGE "]",
            "samples per step over all ranks, kept when the world size changes; 0 = batch_size x "
            "ranks (elastic: x the starting ranks)"},
           {"seed", "int", text(job().train.seed), "[0, 9223372036854775807]",
            "model initialisation, data order, synthetic data"},
           {"threads", "int", text(job().train.threads), "[0, 4096]",
            "intra-op threads per rank; 0 = cores / local ranks"},
           {"log_every", "int", text(job().train.log_every), "[0, " DOPT_HUGE "]",
            "steps between progress lines"},
           {"max_steps", "int", text(job().train.max_steps), "[0, " DOPT_HUGE "]",
            "stop each epoch after this many steps (0 = all)"},
           {"drop_last", "bool", text(job().train.drop_last), "",
            "drop the epoch's last partial batch; false splits it and joins idle ranks"},
           {"device", "string", text(job().train.device), "cpu|cuda|cuda:N",
            "where model, batches and buckets live; cuda = the GPU of the local rank"},
           {"grad_accumulation", "int", text(job().train.grad_accumulation), "[1, " DOPT_HUGE "]",
            "micro-batches per step (gradients reduced once per step)"},
       }},
      {"train.model",
       "`model: {torchscript: PATH}`: your own model, exported from Python with "
       "torch.jit.script or torch.jit.trace and torch.jit.save; forward(inputs) returns logits "
       "[B, classes]; its parameters and buffers train, checkpoint and consolidate under "
       "their PyTorch names",
       {
           {"torchscript", "string", "(required)", "",
            "the TorchScript file (relative: to the job file's directory)"},
       }},
      {"train.tensors",
       "`dataset: tensors`: files written by Python's torch.save, each a dict {'inputs': "
       "tensor [N, ...], 'labels': int tensor [N]} or a tuple (inputs, labels); inputs reach "
       "the model as they are, in the compute dtype",
       {
           {"train", "string", "(required)", "", "the training set (relative: to the job file)"},
           {"test", "string", "(required)", "", "the test set (relative: to the job file)"},
       }},
      {"train.synthetic",
       "`dataset: synthetic`: each class an oriented sine texture under a random phase, plus "
       "uniform noise",
       {
           {"train_samples", "int", text(job().train.synthetic.train_samples), "[1, " DOPT_HUGE "]",
            "training images"},
           {"test_samples", "int", text(job().train.synthetic.test_samples), "[1, " DOPT_HUGE "]",
            "test images"},
           {"channels", "int", text(job().train.synthetic.channels), "[1, 4096]", "image channels"},
           {"height", "int", text(job().train.synthetic.height), "[1, 65536]",
            "image height, pixels"},
           {"width", "int", text(job().train.synthetic.width), "[1, 65536]", "image width, pixels"},
           {"classes", "int", text(job().train.synthetic.classes), "[2, 1048576]",
            "number of classes"},
           {"noise", "double", text(job().train.synthetic.noise), "[0, 1e6]",
            "amplitude of the uniform noise"},
       }},
  };
}

// How the steps run: precision, buffers, uneven inputs, phases, autotuning.
std::vector<SectionSchema> step_sections() {
  return {
      {"precision",
       "mixed precision (absent, or fp32 without loss_scale: off); fp16 needs a CUDA device",
       {
           {"dtype", "string", precision_dtype_name(job().precision.dtype), "bf16|fp16|fp32",
            "the dtype the model computes in"},
           {"master_weights", "string", "fp32", "fp32",
            "the optimizer keeps fp32 master weights (the only choice)"},
           {"loss_scale", "string or double", "dynamic", "dynamic|(0, inf)",
            "dynamic loss scaling, or a static scale"},
           {"init_scale", "double", text(job().precision.init_scale), "(0, inf)",
            "dynamic: the first scale"},
           {"growth_factor", "double", text(job().precision.growth_factor), "(1, inf)",
            "dynamic: x this after growth_interval good steps"},
           {"backoff_factor", "double", text(job().precision.backoff_factor), "(0, 1)",
            "dynamic: x this after a step with inf/NaN (that step is skipped)"},
           {"growth_interval", "int", text(job().precision.growth_interval), "[1, " DOPT_HUGE "]",
            "dynamic: consecutive good steps before growing"},
           {"min_scale", "double", text(job().precision.min_scale), "(0, inf)",
            "dynamic: never back off below this; at most init_scale"},
       }},
      {"buffers",
       "module buffers after every step",
       {
           {"sync", "string", buffer_sync_name(job().buffer_sync), "broadcast|average|none",
            "rank 0's values (DDP's broadcast_buffers), the float buffers' mean, or nothing"},
       }},
      {"join",
       "uneven inputs: DistributedOptimizer::join() (PyTorch's Join)",
       {
           {"enabled", "bool", text(job().join.enabled), "",
            "allow join(); every step starts with a 4-byte allreduce"},
           {"divide_by_initial_world_size", "bool", text(job().join.divide_by_initial_world_size),
            "", "average over the world size even while ranks have joined"},
       }},
      {"elastic",
       "elastic training: survivors of a dead rank go on from the last in-memory commit",
       {
           {"enabled", "bool", text(job().elastic.enabled), "",
            "recover from a dead rank instead of ending the job"},
           {"min_ranks", "int", text(job().elastic.min_ranks), "[1, 1048576]",
            "fewer survivors end the job"},
           {"max_ranks", "int", text(job().elastic.max_ranks), "[0, 1048576]",
            "the largest world; 0 = the starting world size"},
           {"commit_every", "int", text(job().elastic.commit_every), "[1, " DOPT_HUGE "]",
            "optimizer steps between in-memory commits (rollback points)"},
           {"settle_s", "double", text(job().elastic.settle_s), "[0, 3600]",
            "a recovery waits this long for survivors not declared dead by the launcher"},
       }},
      {"schedule[k]",
       "one phase of `schedule:`; every phase but the last has exactly one bound, the last none",
       {
           {"until_epoch", "int", "(none)", "[1, " DOPT_HUGE "]",
            "the phase ends when this many epochs are done"},
           {"until_step", "int", "(none)", "[1, " DOPT_HUGE "]",
            "the phase ends when this many optimizer steps are done"},
           {"algorithm", "component", "(the top-level algorithm)", "", "this phase's algorithm"},
           {"reducer", "component", "(the top-level reducer)", "", "this phase's reducer"},
       }},
      {"autotune",
       "present (even empty) turns it on; not together with schedule:",
       {
           // The section's presence turns it on (JobConfig::Autotune::enabled is
           // false for a job without it).
           {"enabled", "bool", "true", "", "false keeps the section but tunes nothing"},
           {"steps", "int", text(job().autotune.steps), "[3, " DOPT_HUGE "]",
            "steps timed per setting"},
           {"trials", "int", text(job().autotune.trials), "[2, 5]", "bucket_cap_mb values tried"},
           {"overlap", "bool", text(job().autotune.overlap), "", "also try overlap flipped"},
           {"hierarchical", "bool", text(job().autotune.hierarchical), "",
            "also try mean <-> hierarchical where it applies"},
       }},
  };
}

std::vector<SectionSchema> build() {
  std::vector<SectionSchema> all;
  for (auto group :
       {job_sections, component_sections, optimizer_sections, train_sections, step_sections}) {
    std::vector<SectionSchema> part = group();
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

#undef DOPT_HUGE

}  // namespace

const std::vector<SectionSchema>& config_sections() {
  static const std::vector<SectionSchema> sections = build();
  return sections;
}

const SectionSchema& config_section(const std::string& path) {
  for (const auto& s : config_sections())
    if (path == s.path) return s;
  throw std::logic_error("key_schema: no section '" + path + "'");
}

std::vector<std::string> config_keys(const std::string& path) {
  std::vector<std::string> names;
  for (const auto& k : config_section(path).keys) names.push_back(k.key);
  return names;
}

namespace config {

const KeySpec& config_key(const std::string& section, const std::string& key) {
  for (const auto& k : config_section(section).keys)
    if (key == k.key) return k;
  throw std::logic_error("key_schema: no key '" + key + "' in section '" + section + "'");
}

KeyRange key_range(const KeySpec& spec) {
  KeyRange r;
  const std::string type = spec.type, range = spec.range;
  if (type == "int" || type == "double") {
    auto bad = [&] {
      return std::logic_error(std::string("key_schema: key '") + spec.key + "' has range '" +
                              range + "', not an interval such as [0, 1] or (0, inf)");
    };
    const size_t comma = range.find(", ");
    if (range.size() < 6 || comma == std::string::npos || (range[0] != '[' && range[0] != '(') ||
        (range.back() != ']' && range.back() != ')'))
      throw bad();
    const std::string lo = range.substr(1, comma - 1);
    const std::string hi = range.substr(comma + 2, range.size() - comma - 3);
    r.numeric = true;
    r.lo_open = range[0] == '(';
    r.hi_open = range.back() == ')';
    char* end = nullptr;
    r.lo = std::strtod(lo.c_str(), &end);
    if (*end != '\0' || lo.empty()) throw bad();
    r.hi = std::strtod(hi.c_str(), &end);
    if (*end != '\0' || hi.empty()) throw bad();
    if (type == "int") {
      errno = 0;
      r.int_lo = std::strtoll(lo.c_str(), &end, 10);
      if (*end != '\0' || errno) throw bad();
      if (hi == "inf") {
        r.int_hi = std::numeric_limits<int64_t>::max();
      } else {
        r.int_hi = std::strtoll(hi.c_str(), &end, 10);
        if (*end != '\0' || errno) throw bad();
      }
      if (r.lo_open) ++r.int_lo;
      if (r.hi_open && hi != "inf") --r.int_hi;
    }
  } else if (type == "string" && !range.empty()) {
    size_t at = 0;
    while (at <= range.size()) {
      const size_t bar = std::min(range.find('|', at), range.size());
      r.choices.push_back(range.substr(at, bar - at));
      at = bar + 1;
    }
  }
  return r;
}

}  // namespace config

}  // namespace distopt
