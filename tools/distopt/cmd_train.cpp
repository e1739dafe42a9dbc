// `distopt train JOB.yaml [--data DIR] [--metrics FILE] [--plugin-path DIR]... [--epochs N]
//  [--max-steps N] [--threads N] [--world-size N] [--checkpoint DIR [--checkpoint-every N]
//  [--keep N] [--resume | --resume-from STEP]]`
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <climits>
#include <cstdio>
#include <iostream>
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

int cmd_train(int argc, char** argv) {
  std::string config, data, metrics, resume_from;
  std::vector<std::string> plugin_paths;
  int64_t epochs = 0, max_steps = -1, threads = 0, world_size = 0;
  train::TrainOptions topts;
  po::options_description desc(
      "usage: distopt train JOB.yaml [--data DIR] [--metrics FILE] [--plugin-path DIR]... "
      "[--epochs N] "
      "[--max-steps N] [--threads N] [--world-size N]\n"
      "       [--checkpoint DIR [--checkpoint-every N] [--keep N] [--resume | --resume-from "
      "STEP]]\n\n"
      "Train the job's model on Fashion-MNIST with its distributed optimizer. Started without a\n"
      "launcher and with world.size > 1, it starts world.size local ranks itself (as\n"
      "`distopt launch` does); under a launcher (distopt launch, torchrun, srun, mpirun) it\n"
      "runs as the rank the environment names. Test-only: DISTOPT_FAULT_INJECT=exit:RANK:STEP "
      "makes\n"
      "rank RANK exit with code 137 at global step STEP; DISTOPT_FAULT_INJECT=save:RANK:N\n"
      "kills rank RANK halfway through writing its N-th checkpoint shard.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "data", po::value<std::string>(&data), "Fashion-MNIST directory (default: train.data_dir)")(
      "metrics", po::value<std::string>(&metrics),
      "write per-epoch and summary metrics as JSON lines")(
      "plugin-path,P", po::value<std::vector<std::string>>(&plugin_paths)->composing(),
      "extra plugin directory, searched before plugins.paths (repeatable)")(
      "epochs", po::value<int64_t>(&epochs), "override train.epochs")(
      "max-steps", po::value<int64_t>(&max_steps),
      "override train.max_steps (steps per epoch, 0 = all)")(
      "threads", po::value<int64_t>(&threads),
      "override train.threads (intra-op threads per rank, 0 = auto)")(
      "world-size", po::value<int64_t>(&world_size),
      "override world.size (e.g. resume a checkpoint with another number of ranks)")(
      "checkpoint", po::value<std::string>(&topts.checkpoint_dir),
      "save sharded checkpoints in DIR at the end of each epoch")(
      "checkpoint-every", po::value<int64_t>(&topts.checkpoint_every),
      "also save every N global steps")("keep", po::value<int>(&topts.keep),
                                        "complete checkpoints to keep (default 2)")(
      "resume", po::bool_switch(&topts.resume),
      "continue from the newest checkpoint in --checkpoint DIR (start afresh if none)")(
      "resume-from", po::value<std::string>(&resume_from),
      "continue from the checkpoint of global step STEP in --checkpoint DIR, or from a step "
      "directory (DIR/step-000000117); saves still go to --checkpoint DIR, where the next one "
      "replaces the newer checkpoints");
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&config), "");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("config", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt train: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (config.empty()) {
    std::cerr << "distopt train: no job file given\n" << desc << "\n";
    return 2;
  }
  if (vm.count("epochs") && epochs < 1) {
    std::cerr << "distopt train: --epochs must be at least 1\n";
    return 2;
  }
  if (vm.count("threads") && (threads < 0 || threads > 4096)) {
    std::cerr << "distopt train: --threads must be in 0..4096\n";
    return 2;
  }
  if (vm.count("world-size") && (world_size < 1 || world_size > 4096)) {
    std::cerr << "distopt train: --world-size must be in 1..4096\n";
    return 2;
  }
  if ((topts.resume || vm.count("checkpoint-every") || vm.count("keep")) &&
      topts.checkpoint_dir.empty()) {
    std::cerr << "distopt train: --resume, --checkpoint-every and --keep need --checkpoint DIR\n";
    return 2;
  }
  if (vm.count("resume-from")) {
    if (topts.resume) {
      std::cerr << "distopt train: give --resume or --resume-from, not both\n";
      return 2;
    }
    const bool number = !resume_from.empty() && resume_from.size() < 19 &&
                        resume_from.find_first_not_of("0123456789") == std::string::npos;
    if (number && topts.checkpoint_dir.empty()) {
      std::cerr << "distopt train: --resume-from " << resume_from
                << " (a step) needs --checkpoint DIR; or give a step directory\n";
      return 2;
    }
    topts.resume_from =
        number ? checkpoint_step_path(topts.checkpoint_dir, std::stoll(resume_from)) : resume_from;
    if (!find_checkpoint(topts.resume_from))
      throw CheckpointError("--resume-from " + resume_from + ": no checkpoint there");
    topts.resume = true;
  }
  if (topts.checkpoint_every < 0 || topts.keep < 1) {
    std::cerr << "distopt train: --checkpoint-every must be >= 0 and --keep >= 1\n";
    return 2;
  }
  if (vm.count("max-steps") && max_steps < 0) {
    std::cerr << "distopt train: --max-steps must not be negative\n";
    return 2;
  }

  JobConfig cfg = load_job_config(config);
  check_plugin_dirs(cfg);
  std::vector<std::string> paths;
  for (const auto& p : plugin_paths) paths.push_back(absolute(p));
  paths.insert(paths.end(), cfg.plugin_paths.begin(), cfg.plugin_paths.end());
  cfg.plugin_paths = paths;
  if (!data.empty()) cfg.train.data_dir = data;
  if (vm.count("epochs")) cfg.train.epochs = epochs;
  if (vm.count("max-steps")) cfg.train.max_steps = max_steps;
  if (vm.count("threads")) cfg.train.threads = threads;
  if (vm.count("world-size")) cfg.world_size = world_size;
  topts.metrics_path = metrics;

  const ProcessInfo proc = detect_process_info();
  if (proc.source == "default" && cfg.world_size > 1) {
    // No launcher around us: be the launcher, one re-executed `distopt train` per rank.
    launch::LaunchOptions lo;
    lo.name = "distopt train";
    lo.nprocs = static_cast<int>(cfg.world_size);
    lo.argv = {self_exe(), "train"};
    // Survivors of a failed rank get time to explain it: the collective
    // check waits up to min(collective_check_s, 3 s) for a dead peer.
    lo.failure_wait_s = 1.0 + std::min(cfg.collective_check_s, 3.0);
    launch::note_job_rendezvous(cfg, lo);  // replaced by the launcher's: say so
    for (int i = 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
    std::cout.flush();
    return launch::run(lo);
  }
  // Lines, not blocks, so a launcher's prefixes interleave sensibly.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return train::train_rank(cfg, topts);
}

}  // namespace

DISTOPT_REGISTER_COMMAND("train",
                         "train a model on Fashion-MNIST with the job's distributed optimizer",
                         cmd_train);

}  // namespace distopt::cli
