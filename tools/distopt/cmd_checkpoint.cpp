// `distopt checkpoint info DIR [--step N]` and `distopt checkpoint consolidate
// DIR OUT.pt [--step N]`: inspect a sharded checkpoint directory (every step it
// holds) and turn one of its checkpoints into one file Python's torch.load reads.
// DIR may also be one step directory (DIR/step-000000117).
#include <boost/program_options.hpp>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/checkpoint.hpp"
#include "distopt/checkpoint_steps.hpp"
#include "distopt/error.hpp"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "usage: distopt checkpoint info DIR [--step N]\n"
    "       distopt checkpoint consolidate DIR OUT.pt [--step N]\n\n"
    "DIR is a checkpoint directory (`distopt train --checkpoint DIR`) or one of its step\n"
    "directories (DIR/step-000000117), which selects that checkpoint; --step N selects the\n"
    "checkpoint of global step N in DIR. Without either: the newest (DIR/latest).\n\n"
    "info         list every complete checkpoint in DIR (step, world size, path), then\n"
    "             describe the selected one (step, world size, algorithm, reducer,\n"
    "             optimizer, application state)\n"
    "consolidate  read every shard of the selected checkpoint (checking sizes and CRC-32s),\n"
    "             assemble each tensor whole and write OUT.pt for torch.load: {'model':\n"
    "             {name: tensor}, 'optimizer_state': {param: {field: tensor}}, 'state':\n"
    "             {key: tensor}, ...}\n\n"
    "`distopt checkpoint SUBCOMMAND --help` shows its options.\n";

struct Parsed {
  bool help = false;
  std::vector<std::string> args;  // positional
  std::optional<int64_t> step;
};

// Options of one subcommand; throws po::error.
Parsed parse(int argc, char** argv, const po::options_description& desc) {
  Parsed p;
  po::options_description hidden;
  hidden.add_options()("args", po::value<std::vector<std::string>>(&p.args), "");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
  po::notify(vm);
  p.help = vm.count("help") > 0;
  if (vm.count("step")) p.step = vm["step"].as<int64_t>();
  return p;
}

// The step directory the arguments select ("" = the newest of dir).
std::string selected(const std::string& dir, const std::optional<int64_t>& step) {
  if (!step) return dir;
  if (*step < 0) throw distopt::ConfigError("--step must not be negative");
  return distopt::checkpoint_step_path(dir, *step);
}

void describe(const distopt::CheckpointInfo& info) {
  std::cout << "checkpoint: " << info.path << "\n"
            << "  step: " << info.step << "\n"
            << "  world size: " << info.world_size << "\n"
            << "  algorithm: " << info.algorithm << ", reducer: " << info.reducer
            << ", optimizer: " << info.optimizer << "\n";
  for (const auto& [k, v] : info.extra) std::cout << "  " << k << ": " << v << "\n";
}

int run_info(int argc, char** argv) {
  po::options_description desc(
      "usage: distopt checkpoint info DIR [--step N]\n\n"
      "List every complete checkpoint in DIR, then describe the newest, the one of --step N,\n"
      "or (DIR a step directory, DIR/step-000000117) that one.\n\noptions");
  desc.add_options()("help,h", "show this help")("step", po::value<int64_t>(),
                                                 "describe the checkpoint of global step N");
  Parsed p;
  try {
    p = parse(argc, argv, desc);
  } catch (const po::error& e) {
    std::cerr << "distopt checkpoint info: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (p.help) {
    std::cout << desc << "\n";
    return 0;
  }
  if (p.args.size() != 1) {
    std::cerr << "distopt checkpoint info: give one checkpoint directory\n" << desc << "\n";
    return 2;
  }
  const std::string& dir = p.args[0];
  const std::vector<distopt::CheckpointInfo> all = distopt::list_checkpoints(dir);
  const auto newest = distopt::find_checkpoint(dir);
  if (all.empty() && !newest)
    throw distopt::CheckpointError(dir + ": no checkpoint (no step directory with a manifest)");
  std::cout << dir << ": " << all.size() << " checkpoint" << (all.size() == 1 ? "" : "s") << "\n";
  for (const auto& c : all)
    std::cout << "  step " << c.step << "  world size " << c.world_size << "  " << c.path
              << (newest && newest->path == c.path ? "  (latest)" : "") << "\n";
  const std::string which = selected(dir, p.step);
  const auto info = distopt::find_checkpoint(which);
  if (!info)
    throw distopt::CheckpointError(dir +
                                   ": no 'latest' file; select one with --step N or a "
                                   "step directory");
  describe(*info);
  return 0;
}

int run_consolidate(int argc, char** argv) {
  po::options_description desc(
      "usage: distopt checkpoint consolidate DIR OUT.pt [--step N]\n\n"
      "Write the newest checkpoint of DIR, the one of --step N, or (DIR a step directory)\n"
      "that one as OUT.pt, one file for Python's torch.load.\n\noptions");
  desc.add_options()("help,h", "show this help")("step", po::value<int64_t>(),
                                                 "consolidate the checkpoint of global step N");
  Parsed p;
  try {
    p = parse(argc, argv, desc);
  } catch (const po::error& e) {
    std::cerr << "distopt checkpoint consolidate: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (p.help) {
    std::cout << desc << "\n";
    return 0;
  }
  if (p.args.size() != 2) {
    std::cerr << "distopt checkpoint consolidate: give a checkpoint directory and OUT.pt\n"
              << desc << "\n";
    return 2;
  }
  const std::string which = selected(p.args[0], p.step);
  distopt::consolidate_checkpoint(which, p.args[1]);
  const auto info = distopt::find_checkpoint(which);
  std::cout << "wrote " << p.args[1];
  if (info) std::cout << " (step " << info->step << ", " << info->path << ")";
  std::cout << "\n"
            << "Python: torch.load(path) (weights_only=True too: tensors and plain containers)\n";
  return 0;
}

int run_checkpoint(int argc, char** argv) {
  const std::string sub = argc > 1 ? argv[1] : "";
  if (sub == "-h" || sub == "--help") {
    std::cout << kUsage;
    return 0;
  }
  std::string prog = std::string(argv[0]) + " " + sub;
  if (sub == "info" || sub == "consolidate") {
    argv[1] = prog.data();
    return sub == "info" ? run_info(argc - 1, argv + 1) : run_consolidate(argc - 1, argv + 1);
  }
  std::cerr << "distopt checkpoint: "
            << (sub.empty() ? "no subcommand" : "unknown subcommand '" + sub + "'") << "\n"
            << kUsage;
  return 2;
}

}  // namespace

DISTOPT_REGISTER_COMMAND("checkpoint",
                         "list, inspect or consolidate sharded checkpoints (info, consolidate)",
                         run_checkpoint);
