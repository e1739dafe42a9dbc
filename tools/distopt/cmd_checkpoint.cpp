// `distopt checkpoint info DIR` and `distopt checkpoint consolidate DIR OUT.pt`:
// inspect a sharded checkpoint and turn it into one file Python's torch.load reads.
#include <iostream>
#include <string>

#include "command.hpp"
#include "distopt/checkpoint.hpp"
#include "distopt/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: distopt checkpoint info DIR\n"
    "       distopt checkpoint consolidate DIR OUT.pt\n\n"
    "info         print the newest complete checkpoint in DIR (step, world size,\n"
    "             algorithm, reducer, optimizer, application state)\n"
    "consolidate  read every shard of it (checking sizes and CRC-32s), assemble each\n"
    "             tensor whole and write OUT.pt for torch.load: {'model': {name: tensor},\n"
    "             'optimizer_state': {param: {field: tensor}}, 'state': {key: tensor}, ...}\n";

int run_checkpoint(int argc, char** argv) {
  const std::string sub = argc > 1 ? argv[1] : "";
  if (sub == "-h" || sub == "--help") {
    std::cout << kUsage;
    return 0;
  }
  if (sub == "info" && argc == 3) {
    auto info = distopt::find_checkpoint(argv[2]);
    if (!info) throw distopt::CheckpointError(std::string(argv[2]) + ": no checkpoint");
    std::cout << "checkpoint: " << info->path << "\n"
              << "  step: " << info->step << "\n"
              << "  world size: " << info->world_size << "\n"
              << "  algorithm: " << info->algorithm << ", reducer: " << info->reducer
              << ", optimizer: " << info->optimizer << "\n";
    for (const auto& [k, v] : info->extra) std::cout << "  " << k << ": " << v << "\n";
    return 0;
  }
  if (sub == "consolidate" && argc == 4) {
    distopt::consolidate_checkpoint(argv[2], argv[3]);
    std::cout << "wrote " << argv[3] << "\n"
              << "Python: torch.load(path); PyTorch >= 2.6 (weights_only by default) first "
                 "needs torch.serialization.add_safe_globals([torch.jit._pickle.restore_type_tag])"
                 "\n";
    return 0;
  }
  std::cerr << "distopt checkpoint: bad arguments\n" << kUsage;
  return 2;
}

}  // namespace

DISTOPT_REGISTER_COMMAND("checkpoint",
                         "inspect or consolidate a sharded checkpoint (info, consolidate)",
                         run_checkpoint);
