// `distopt`: dispatch to the subcommand named by argv[1].
#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/abi.h"
#include "distopt/blas.hpp"
#include "distopt/error.hpp"

#ifndef DISTOPT_VERSION
#define DISTOPT_VERSION "unknown"
#endif

namespace distopt::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> cmds;
  return cmds;
}
bool register_command(const Command& cmd) {
  registry().push_back(cmd);
  return true;
}
const std::vector<Command>& commands() { return registry(); }

static void usage(std::ostream& os) {
  os << "usage: distopt <command> [options]\n       distopt --version\n\ncommands:\n";
  std::vector<Command> sorted = commands();  // registration order is link order
  std::sort(sorted.begin(), sorted.end(),
            [](const Command& a, const Command& b) { return std::strcmp(a.name, b.name) < 0; });
  for (const auto& c : sorted) {
    os << "  " << c.name
       << std::string(c.name && std::strlen(c.name) < 12 ? 12 - std::strlen(c.name) : 1, ' ')
       << c.summary << "\n";
  }
  os << "\n`distopt <command> --help` shows a command's options.\n";
}

}  // namespace distopt::cli

int main(int argc, char** argv) {
  using namespace distopt::cli;
  // Before anything else: a misdetected OpenBLAS kernel set costs ~2.7x in
  // training speed, and it can only be changed before the BLAS initialises.
  distopt::reexec_with_better_blas(argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V")) {
    std::cout << "distopt " << DISTOPT_VERSION << " (plugin ABI " << DOPT_ABI_VERSION_MAJOR << "."
              << DOPT_ABI_VERSION_MINOR << ")\n";
    return 0;
  }
  for (const auto& c : commands()) {
    if (std::strcmp(c.name, argv[1]) == 0) {
      std::string prog = std::string("distopt ") + c.name;
      argv[1] = prog.data();
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::cerr << "distopt " << c.name << ": error: " << e.what() << "\n";
        return 1;
      }
    }
  }
  std::cerr << "distopt: unknown command '" << argv[1] << "'\n";
  usage(std::cerr);
  return 2;
}
