// The key tables of the job file's sections (distopt/key_schema.hpp). Adding
// a key the parser accepts is one row here plus its parsing in config.cpp;
// `distopt config reference` and share/doc/distopt/REFERENCE.md follow.
// Defaults mirror config.hpp / precision.hpp; ranges mirror config.cpp's
// getters (tests/config/key_schema_test.cpp checks both ends of each range
// against the parser, and each default parses).
#include "distopt/key_schema.hpp"

#include <stdexcept>

namespace distopt {

namespace {

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
           {"size", "int", "1", "[1, 1048576]",
            "ranks started on this host by `distopt train` / `distopt launch`"},
           {"rendezvous", "string", "tcp://127.0.0.1:29500", "tcp://HOST:PORT|env://|file://PATH",
            "where the ranks meet (env://: MASTER_ADDR, MASTER_PORT)"},
           {"timeout_s", "double", "60", "(0, 1e9]",
            "rendezvous and default operation timeout, seconds"},
           {"collective_check_s", "double", "2", "[0, 1e9]",
            "a collective waiting this long makes the ranks compare what they wait on (0 = off)"},
           {"watchdog_s", "double", "0", "[0, 1e9]",
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
           {"name", "string", "tcp", "", kComponentName},
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
           {"name", "string", "mean", "", kComponentName},
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
           {"name", "string", "allreduce", "", kComponentName},
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
           {"name", "string", "sgd", "sgd|adam|adamw|adagrad|rmsprop",
            "the inner update rule (libtorch's optimizer of that name)"},
           {"lr_schedule", "map or name", "(none: constant)", "",
            "learning-rate schedule, each group's lr x factor(step) (optimizer.lr_schedule "
            "below; lr-schedule-and-clipping.md)"},
           {"grad_clip", "double", "0", "[0, inf)",
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
           {"warmup_steps", "int", "0", "[0, " DOPT_HUGE "]",
            "step, multi_step, cosine, linear: linear warm-up steps first"},
           {"warmup_start_factor", "double", "0", "[0, 1]", "the factor at step 0 of the warm-up"},
           {"step_size", "int", "1", "[1, " DOPT_HUGE "]", "step: steps per decay"},
           {"gamma", "double", "0.1", "(0, inf)", "step, multi_step: decay factor"},
           {"milestones", "list of int", "(required)", "strictly increasing, > 0",
            "multi_step: steps at which the factor is multiplied by gamma"},
           {"total_steps", "int", "(distopt train: epochs x steps per epoch)", "[1, " DOPT_HUGE "]",
            "cosine, linear, one_cycle: length, warm-up included"},
           {"min_lr_factor", "double", "0", "[0, 1]", "cosine: the final factor"},
           {"end_factor", "double", "0", "[0, 1]", "linear: the final factor"},
           {"pct_start", "double", "0.3", "(0, 1)", "one_cycle: fraction of steps rising"},
           {"div_factor", "double", "25", "(0, inf)", "one_cycle: peak / initial lr"},
           {"final_div_factor", "double", "1e4", "(0, inf)", "one_cycle: initial / final lr"},
           {"anneal", "string", "cos", "cos|linear", "one_cycle: anneal strategy"},
       }},
  };
}

// What `distopt train` trains.
std::vector<SectionSchema> train_sections() {
  return {
      {"train",
       "`distopt train`'s model, data and loop (a program that embeds the runtime ignores it)",
       {
           {"model", "string", "mlp", "mlp|cnn|resnet",
            "a built-in model (Models below), or `{torchscript: PATH}` (train.model below)"},
           {"model_width", "int", "0", "[0, 4096]",
            "resnet's base channels; 0 = 8 on the CPU, 64 (ResNet-18) on a GPU"},
           {"dataset", "string", "fashion-mnist", "fashion-mnist|synthetic|tensors",
            "fashion-mnist from data_dir, images generated from their index, or tensors saved "
            "from Python (train.tensors)"},
           {"synthetic", "map", "(every default)", "", "the generated dataset's size and shape"},
           {"tensors", "map", "(required by dataset: tensors)", "",
            "the files of `dataset: tensors` (train.tensors below)"},
           {"data_dir", "string", "/usr/share/datasets/fashion-mnist", "",
            "directory of the Fashion-MNIST IDX files (gzip'd or not)"},
           {"epochs", "int", "2", "[1, " DOPT_HUGE "]", "passes over the training set"},
           {"batch_size", "int", "256", "[1, " DOPT_HUGE "]", "samples per step, per rank"},
           {"global_batch_size", "int", "0", "[0, " DOPT_HUGE "]",
            "samples per step over all ranks, kept when the world size changes; 0 = batch_size x "
            "ranks (elastic: x the starting ranks)"},
           {"seed", "int", "0", "[0, 9223372036854775807]",
            "model initialisation, data order, synthetic data"},
           {"threads", "int", "0", "[0, 4096]",
            "intra-op threads per rank; 0 = cores / local ranks"},
           {"log_every", "int", "20", "[0, " DOPT_HUGE "]", "steps between progress lines"},
           {"max_steps", "int", "0", "[0, " DOPT_HUGE "]",
            "stop each epoch after this many steps (0 = all)"},
           {"drop_last", "bool", "true", "",
            "drop the epoch's last partial batch; false splits it and joins idle ranks"},
           {"device", "string", "cpu", "cpu|cuda|cuda:N",
            "where model, batches and buckets live; cuda = the GPU of the local rank"},
           {"grad_accumulation", "int", "1", "[1, " DOPT_HUGE "]",
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
           {"train_samples", "int", "50000", "[1, " DOPT_HUGE "]", "training images"},
           {"test_samples", "int", "10000", "[1, " DOPT_HUGE "]", "test images"},
           {"channels", "int", "3", "[1, 4096]", "image channels"},
           {"height", "int", "32", "[1, 65536]", "image height, pixels"},
           {"width", "int", "32", "[1, 65536]", "image width, pixels"},
           {"classes", "int", "10", "[2, 1048576]", "number of classes"},
           {"noise", "double", "1", "[0, 1e6]", "amplitude of the uniform noise"},
       }},
  };
}

// How the steps run: precision, buffers, uneven inputs, phases, autotuning.
std::vector<SectionSchema> step_sections() {
  return {
      {"precision",
       "mixed precision (absent, or fp32 without loss_scale: off); fp16 needs a CUDA device",
       {
           {"dtype", "string", "fp32", "bf16|fp16|fp32", "the dtype the model computes in"},
           {"master_weights", "string", "fp32", "fp32",
            "the optimizer keeps fp32 master weights (the only choice)"},
           {"loss_scale", "string or double", "dynamic", "dynamic|(0, inf)",
            "dynamic loss scaling, or a static scale"},
           {"init_scale", "double", "65536", "(0, inf)", "dynamic: the first scale"},
           {"growth_factor", "double", "2", "(1, inf)",
            "dynamic: x this after growth_interval good steps"},
           {"backoff_factor", "double", "0.5", "(0, 1)",
            "dynamic: x this after a step with inf/NaN (that step is skipped)"},
           {"growth_interval", "int", "2000", "[1, " DOPT_HUGE "]",
            "dynamic: consecutive good steps before growing"},
           {"min_scale", "double", "1", "(0, inf)",
            "dynamic: never back off below this; at most init_scale"},
       }},
      {"buffers",
       "module buffers after every step",
       {
           {"sync", "string", "broadcast", "broadcast|average|none",
            "rank 0's values (DDP's broadcast_buffers), the float buffers' mean, or nothing"},
       }},
      {"join",
       "uneven inputs: DistributedOptimizer::join() (PyTorch's Join)",
       {
           {"enabled", "bool", "false", "",
            "allow join(); every step starts with a 4-byte allreduce"},
           {"divide_by_initial_world_size", "bool", "false", "",
            "average over the world size even while ranks have joined"},
       }},
      {"elastic",
       "elastic training: survivors of a dead rank go on from the last in-memory commit",
       {
           {"enabled", "bool", "false", "", "recover from a dead rank instead of ending the job"},
           {"min_ranks", "int", "1", "[1, 1048576]", "fewer survivors end the job"},
           {"max_ranks", "int", "0", "[0, 1048576]",
            "the largest world; 0 = the starting world size"},
           {"commit_every", "int", "1", "[1, " DOPT_HUGE "]",
            "optimizer steps between in-memory commits (rollback points)"},
           {"settle_s", "double", "2", "[0, 3600]",
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
           {"enabled", "bool", "true", "", "false keeps the section but tunes nothing"},
           {"steps", "int", "20", "[3, " DOPT_HUGE "]", "steps timed per setting"},
           {"trials", "int", "4", "[2, 5]", "bucket_cap_mb values tried"},
           {"overlap", "bool", "true", "", "also try overlap flipped"},
           {"hierarchical", "bool", "true", "", "also try mean <-> hierarchical where it applies"},
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

}  // namespace distopt
