// Subcommand registry of the `distopt` CLI: each cmd_*.cpp registers itself.
#pragma once

#include <string>
#include <vector>

namespace distopt::cli {

/// A subcommand. run() gets argv with argv[0] = "distopt <name>" and returns
/// the process exit code; it may throw distopt::Error (printed by main, exit 1).
struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

bool register_command(const Command& cmd);
const std::vector<Command>& commands();

}  // namespace distopt::cli

#define DISTOPT_REGISTER_COMMAND(NAME, SUMMARY, FN) \
  static const bool distopt_cmd_registered_##FN =   \
      ::distopt::cli::register_command({NAME, SUMMARY, FN})
