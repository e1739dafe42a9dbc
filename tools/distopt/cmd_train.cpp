// `distopt train JOB.yaml [--data DIR] [--metrics FILE] [--plugin-path DIR]... [--epochs N]
//  [--max-steps N] [--threads N] [--world-size N] [--checkpoint DIR [--checkpoint-every N]
//  [--keep N] [--resume | --resume-from STEP]]`
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <climits>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/checkpoint_steps.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/process.hpp"
#include "launch/job_rendezvous.hpp"
#include "launch/launcher.hpp"
#include "train/trainer.hpp"

namespace po = boost::program_options;

namespace distopt::cli {
namespace {

// `p` against the current directory, as std::filesystem::absolute (not
// used: see tools/check_symbols.sh for why).
std::string absolute(const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  char buf[PATH_MAX];
  if (::getcwd(buf, sizeof buf) == nullptr) return p;
  const std::string cwd = buf;
  return cwd.back() == '/' ? cwd + p : cwd + "/" + p;
}

// This executable, for re-executing it once per rank.
std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (k <= 0) throw Error("cannot find the distopt executable (/proc/self/exe)");
  buf[k] = '\0';
  return buf;
}

// The command line of `distopt train`: what the options name, and whether
// each was given (an override applies only then).
struct TrainArgs {
  std::string config, data, metrics, resume_from;
  std::vector<std::string> plugin_paths;
  int64_t epochs = 0, max_steps = -1, threads = 0, world_size = 0;
  train::TrainOptions topts;
  po::variables_map vm;
};

po::options_description train_options(TrainArgs& a) {
  po::options_description desc(
      "usage: distopt train JOB.yaml [--data DIR] [--metrics FILE] [--plugin-path DIR]... "
      "[--epochs N] "
      "[--max-steps N] [--threads N] [--world-size N]\n"
      "       [--checkpoint DIR [--checkpoint-every N] [--keep N] [--resume | --resume-from "
      "STEP]]\n\n"
      "Train the job's model (train.model: mlp, cnn, resnet) on its dataset (train.dataset:\n"
      "fashion-mnist, or synthetic images) with its distributed optimizer. Started without a\n"
      "launcher and with world.size > 1, it starts world.size local ranks itself (as\n"
      "`distopt launch` does); under a launcher (distopt launch, torchrun, srun, mpirun) it\n"
      "runs as the rank the environment names. Test-only: DISTOPT_FAULT_INJECT=exit:RANK:STEP "
      "makes\n"
      "rank RANK exit with code 137 at global step STEP (wait_join:STEP: every rank waits there\n"
      "until a process asks to join the elastic job); DISTOPT_FAULT_INJECT=save:RANK:N\n"
      "kills rank RANK halfway through writing its N-th checkpoint shard.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "data", po::value<std::string>(&a.data), "Fashion-MNIST directory (default: train.data_dir)")(
      "metrics", po::value<std::string>(&a.metrics),
      "write per-epoch and summary metrics as JSON lines (appended to with --resume or "
      "--resume-from)")("plugin-path,P",
                        po::value<std::vector<std::string>>(&a.plugin_paths)->composing(),
                        "extra plugin directory, searched before plugins.paths (repeatable)")(
      "epochs", po::value<int64_t>(&a.epochs), "override train.epochs")(
      "max-steps", po::value<int64_t>(&a.max_steps),
      "override train.max_steps (steps per epoch, 0 = all)")(
      "threads", po::value<int64_t>(&a.threads),
      "override train.threads (intra-op threads per rank, 0 = auto)")(
      "world-size", po::value<int64_t>(&a.world_size),
      "override world.size (e.g. resume a checkpoint with another number of ranks)")(
      "checkpoint", po::value<std::string>(&a.topts.checkpoint_dir),
      "save sharded checkpoints in DIR at the end of each epoch")(
      "checkpoint-every", po::value<int64_t>(&a.topts.checkpoint_every),
      "also save every N global steps")("keep", po::value<int>(&a.topts.keep),
                                        "complete checkpoints to keep (default 2)")(
      "resume", po::bool_switch(&a.topts.resume),
      "continue from the newest checkpoint in --checkpoint DIR (start afresh if none)")(
      "resume-from", po::value<std::string>(&a.resume_from),
      "continue from the checkpoint of global step STEP in --checkpoint DIR, or from a step "
      "directory (DIR/step-000000117); saves still go to --checkpoint DIR, where the next one "
      "replaces the newer checkpoints");
  return desc;
}

// Checks the options' values; on a usage error prints it and returns false.
// Resolves --resume-from (a step number or a step directory) into
// topts.resume_from and topts.resume; throws CheckpointError if it names no
// checkpoint.
bool check_train_args(TrainArgs& a, const po::options_description& desc) {
  const po::variables_map& vm = a.vm;
  train::TrainOptions& topts = a.topts;
  if (a.config.empty()) {
    std::cerr << "distopt train: no job file given\n" << desc << "\n";
    return false;
  }
  if (vm.count("epochs") && a.epochs < 1) {
    std::cerr << "distopt train: --epochs must be at least 1\n";
    return false;
  }
  if (vm.count("threads") && (a.threads < 0 || a.threads > 4096)) {
    std::cerr << "distopt train: --threads must be in 0..4096\n";
    return false;
  }
  if (vm.count("world-size") && (a.world_size < 1 || a.world_size > 4096)) {
    std::cerr << "distopt train: --world-size must be in 1..4096\n";
    return false;
  }
  if ((topts.resume || vm.count("checkpoint-every") || vm.count("keep")) &&
      topts.checkpoint_dir.empty()) {
    std::cerr << "distopt train: --resume, --checkpoint-every and --keep need --checkpoint DIR\n";
    return false;
  }
  if (vm.count("resume-from")) {
    if (topts.resume) {
      std::cerr << "distopt train: give --resume or --resume-from, not both\n";
      return false;
    }
    const std::string& from = a.resume_from;
    const bool number = !from.empty() && from.size() < 19 &&
                        from.find_first_not_of("0123456789") == std::string::npos;
    if (number && topts.checkpoint_dir.empty()) {
      std::cerr << "distopt train: --resume-from " << from
                << " (a step) needs --checkpoint DIR; or give a step directory\n";
      return false;
    }
    topts.resume_from =
        number ? checkpoint_step_path(topts.checkpoint_dir, std::stoll(from)) : from;
    if (!find_checkpoint(topts.resume_from))
      throw CheckpointError("--resume-from " + from + ": no checkpoint there");
    topts.resume = true;
  }
  if (topts.checkpoint_every < 0 || topts.keep < 1) {
    std::cerr << "distopt train: --checkpoint-every must be >= 0 and --keep >= 1\n";
    return false;
  }
  if (vm.count("max-steps") && a.max_steps < 0) {
    std::cerr << "distopt train: --max-steps must not be negative\n";
    return false;
  }
  return true;
}

// The job file with the command line's overrides: --plugin-path directories
// (made absolute, as the re-executed ranks may run elsewhere) before the
// job's plugins.paths, then the train and world values given.
JobConfig job_with_overrides(const TrainArgs& a) {
  JobConfig cfg = load_job_config(a.config);
  check_plugin_dirs(cfg);
  std::vector<std::string> paths;
  for (const auto& p : a.plugin_paths) paths.push_back(absolute(p));
  paths.insert(paths.end(), cfg.plugin_paths.begin(), cfg.plugin_paths.end());
  cfg.plugin_paths = paths;
  if (!a.data.empty()) cfg.train.data_dir = a.data;
  if (a.vm.count("epochs")) cfg.train.epochs = a.epochs;
  if (a.vm.count("max-steps")) cfg.train.max_steps = a.max_steps;
  if (a.vm.count("threads")) cfg.train.threads = a.threads;
  if (a.vm.count("world-size")) cfg.world_size = a.world_size;
  return cfg;
}

// No launcher around us: be the launcher, one re-executed `distopt train`
// (with this command line) per rank; returns the launcher's exit code.
int launch_local_ranks(const JobConfig& cfg, int argc, char** argv,
                       const std::string& command = "train") {
  launch::LaunchOptions lo;
  lo.name = "distopt " + command;
  lo.nprocs = static_cast<int>(cfg.world_size);
  lo.argv = {self_exe(), command};
  // Survivors of a failed rank get time to explain it: the collective
  // check waits up to min(collective_check_s, 3 s) for a dead peer.
  lo.failure_wait_s = 1.0 + std::min(cfg.collective_check_s, 3.0);
  // Elastic jobs: the launcher serves the store (it outlives any rank),
  // records dead ranks there and lets the others recover.
  lo.elastic = cfg.elastic.enabled;
  launch::note_job_rendezvous(cfg, lo);  // replaced by the launcher's: say so
  for (int i = 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
  std::cout.flush();
  return launch::run(lo);
}

// Parse `distopt NAME JOB.yaml [options]` into `a` (the job file's path and
// `desc`'s options). Returns -1 to go on, else the exit code: 0 after
// --help, 2 after a usage error (both printed with `desc`).
int parse_job_command(const char* name, int argc, char** argv, const po::options_description& desc,
                      TrainArgs& a) {
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&a.config), "");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("config", 1);
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), a.vm);
    po::notify(a.vm);
  } catch (const po::error& e) {
    std::cerr << "distopt " << name << ": " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (a.vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  return -1;
}

int cmd_train(int argc, char** argv) {
  TrainArgs a;
  const po::options_description desc = train_options(a);
  if (const int rc = parse_job_command("train", argc, argv, desc, a); rc >= 0) return rc;
  if (!check_train_args(a, desc)) return 2;

  const JobConfig cfg = job_with_overrides(a);
  a.topts.metrics_path = a.metrics;
  const ProcessInfo proc = detect_process_info();
  if (proc.source == "default" && cfg.world_size > 1) return launch_local_ranks(cfg, argc, argv);
  // Lines, not blocks, so a launcher's prefixes interleave sensibly.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return train::train_rank(cfg, a.topts);
}

// `distopt eval JOB.yaml --checkpoint DIR [--step N]`: the job's model from
// a checkpoint, evaluated on the job's test set; nothing is trained.
int cmd_eval(int argc, char** argv) {
  TrainArgs a;
  std::optional<int64_t> step;
  po::options_description desc(
      "usage: distopt eval JOB.yaml --checkpoint DIR [--step N] [--data DIR] [--metrics FILE]\n"
      "       [--plugin-path DIR]... [--world-size N] [--threads N]\n\n"
      "Evaluate the model of a checkpoint of `distopt train JOB.yaml --checkpoint DIR` on the\n"
      "job's test set, with the job's ranks (world.size, or --world-size: any number of ranks\n"
      "restores any checkpoint), and print its test loss and accuracy. Nothing is trained or\n"
      "saved. DIR may also be a step directory (DIR/step-000000117).\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "checkpoint", po::value<std::string>(&a.topts.checkpoint_dir),
      "the checkpoint directory (its newest checkpoint), or one step directory")(
      "step", po::value<int64_t>(), "evaluate the checkpoint of global step N in DIR")(
      "data", po::value<std::string>(&a.data), "Fashion-MNIST directory (default: train.data_dir)")(
      "metrics", po::value<std::string>(&a.metrics),
      "append the evaluation to FILE as a JSON line")(
      "plugin-path,P", po::value<std::vector<std::string>>(&a.plugin_paths)->composing(),
      "extra plugin directory, searched before plugins.paths (repeatable)")(
      "threads", po::value<int64_t>(&a.threads),
      "override train.threads (intra-op threads per rank, 0 = auto)")(
      "world-size", po::value<int64_t>(&a.world_size), "override world.size");
  if (const int rc = parse_job_command("eval", argc, argv, desc, a); rc >= 0) return rc;
  if (a.config.empty() || a.topts.checkpoint_dir.empty()) {
    std::cerr << "distopt eval: give a job file and --checkpoint DIR\n" << desc << "\n";
    return 2;
  }
  if (a.vm.count("step")) step = a.vm["step"].as<int64_t>();
  if (step && *step < 0) {
    std::cerr << "distopt eval: --step must not be negative\n";
    return 2;
  }
  if (a.vm.count("world-size") && (a.world_size < 1 || a.world_size > 4096)) {
    std::cerr << "distopt eval: --world-size must be in 1..4096\n";
    return 2;
  }
  train::TrainOptions& t = a.topts;
  t.resume_from = step ? checkpoint_step_path(t.checkpoint_dir, *step) : t.checkpoint_dir;
  if (!find_checkpoint(t.resume_from))
    throw CheckpointError(t.resume_from + ": no checkpoint to evaluate");
  t.resume = true;
  t.evaluate_only = true;
  t.checkpoint_dir.clear();  // nothing is saved
  t.metrics_path = a.metrics;
  const JobConfig cfg = job_with_overrides(a);
  const ProcessInfo proc = detect_process_info();
  if (proc.source == "default" && cfg.world_size > 1)
    return launch_local_ranks(cfg, argc, argv, "eval");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return train::train_rank(cfg, t);
}

}  // namespace

DISTOPT_REGISTER_COMMAND("eval", "evaluate a checkpoint's model on the job's test set", cmd_eval);
DISTOPT_REGISTER_COMMAND("train",
                         "train the job's model on its dataset with its distributed optimizer",
                         cmd_train);

}  // namespace distopt::cli
