// `distopt launch -n N [--config JOB.yaml] [--port P] [--timeout S] -- PROGRAM ARGS...`
#include <boost/program_options.hpp>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/config.hpp"
#include "launch/launcher.hpp"

namespace po = boost::program_options;

namespace distopt::cli {
namespace {

int cmd_launch(int argc, char** argv) {
  // Everything after "--" belongs to the program, untouched by option parsing.
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }

  launch::LaunchOptions lo;
  int nprocs = 0;
  po::options_description desc(
      "usage: distopt launch -n N [--config JOB.yaml] [--port P] [--timeout S] -- PROGRAM "
      "ARGS...\n\n"
      "Start N ranks of PROGRAM on this host. Each gets DISTOPT_RANK, DISTOPT_WORLD_SIZE,\n"
      "DISTOPT_LOCAL_RANK, DISTOPT_LOCAL_WORLD_SIZE, DISTOPT_RENDEZVOUS=tcp://127.0.0.1:PORT,\n"
      "DISTOPT_JOB_TOKEN (random per job), DISTOPT_CONFIG (with --config) and, unless already\n"
      "set, OMP_NUM_THREADS = max(1, cores / N). Output lines are\n"
      "prefixed with \"[rank r] \". If a rank fails, the others are stopped and launch exits 1;\n"
      "Ctrl-C stops every rank and exits 130; --timeout exits 124.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "nprocs,n", po::value<int>(&nprocs), "number of ranks (default: world.size of --config)")(
      "config", po::value<std::string>(&lo.config), "job YAML, exported as DISTOPT_CONFIG")(
      "port", po::value<int>(&lo.port)->default_value(0),
      "rendezvous port on 127.0.0.1 (0 = a free one)")(
      "timeout", po::value<double>(&lo.timeout_s)->default_value(0),
      "stop the job after S seconds (0 = never)")(
      "failure-wait", po::value<double>(&lo.failure_wait_s)->default_value(4),
      "seconds the other ranks get to exit and report after one fails, before SIGTERM")(
      "grace", po::value<double>(&lo.grace_s)->default_value(5),
      "seconds between SIGTERM and SIGKILL");
  po::options_description hidden;
  hidden.add_options()("program", po::value<std::vector<std::string>>(), "");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("program", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(split, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt launch: " << e.what() << "\n" << desc << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("program")) lo.argv = vm["program"].as<std::vector<std::string>>();
  for (int i = split + 1; i < argc; ++i) lo.argv.emplace_back(argv[i]);
  if (lo.argv.empty()) {
    std::cerr << "distopt launch: no program given (put it after --)\n" << desc << "\n";
    return 2;
  }
  if (!vm.count("nprocs")) {
    if (lo.config.empty()) {
      std::cerr << "distopt launch: give -n N, or --config JOB.yaml to use its world.size\n";
      return 2;
    }
    nprocs = static_cast<int>(load_job_config(lo.config).world_size);
  } else if (!lo.config.empty() && std::ifstream(lo.config).good()) {
    // Two numbers of ranks: refuse rather than guess which one was meant.
    // (A file this host cannot read is the program's business.)
    const JobConfig job = load_job_config(lo.config);
    YAML::Node size =
        job.root.IsMap() && job.root["world"].IsMap() ? job.root["world"]["size"] : YAML::Node();
    if (size.IsDefined() && !size.IsNull() && job.world_size != nprocs) {
      std::cerr << "distopt launch: -n " << nprocs << " but " << lo.config << ":"
                << size.Mark().line + 1 << ": world.size is " << job.world_size
                << "; give the same number, or leave out -n\n";
      return 2;
    }
  }
  if (nprocs < 1 || nprocs > 4096) {
    std::cerr << "distopt launch: -n must be between 1 and 4096 (got " << nprocs << ")\n";
    return 2;
  }
  if (lo.port < 0 || lo.port > 65535) {
    std::cerr << "distopt launch: --port must be in 0..65535 (got " << lo.port << ")\n";
    return 2;
  }
  if (lo.timeout_s < 0 || lo.grace_s < 0 || lo.failure_wait_s < 0) {
    std::cerr << "distopt launch: --timeout, --failure-wait and --grace must not be negative\n";
    return 2;
  }
  lo.nprocs = nprocs;
  std::cout.flush();
  return launch::run(lo);
}

}  // namespace

DISTOPT_REGISTER_COMMAND("launch", "start N local ranks of a program with the distopt environment",
                         cmd_launch);

}  // namespace distopt::cli
