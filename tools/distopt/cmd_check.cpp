// `distopt check JOB.yaml`: validate a job file against the discovered
// plugins' option schemas without starting anything.
#include <boost/program_options.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "command.hpp"
#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "distopt/registry.hpp"
#include "train/trainer.hpp"

namespace po = boost::program_options;

namespace {

int run_check(int argc, char** argv) {
  po::options_description visible(
      "usage: distopt check JOB.yaml [--plugin-path DIR]...\n\n"
      "Validate JOB.yaml: its sections and keys, that each selected component exists\n"
      "among the discovered plugins, and its options against the component's schema.\n"
      "Exit status 0 when valid, 1 with FILE:LINE:COLUMN and the reason when not.\n\noptions");
  visible.add_options()("help,h", "show this help")(
      "plugin-path,P", po::value<std::vector<std::string>>()->composing(),
      "search DIR for plugins first, before plugins.paths, $DISTOPT_PLUGIN_PATH and the install "
      "dir "
      "(repeatable)");
  po::options_description all;
  all.add(visible).add_options()("job", po::value<std::string>(), "job file");
  po::positional_options_description pos;
  pos.add("job", 1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "distopt check: " << e.what() << "\n\n" << visible << "\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << visible << "\n";
    return 0;
  }
  if (!vm.count("job")) {
    std::cerr << "distopt check: missing JOB.yaml\n\n" << visible << "\n";
    return 2;
  }
  const std::string path = vm["job"].as<std::string>();
  try {
    distopt::JobConfig cfg = distopt::load_job_config(path);
    distopt::check_plugin_dirs(cfg);
    std::vector<std::string> cli_paths;
    if (vm.count("plugin-path")) cli_paths = vm["plugin-path"].as<std::vector<std::string>>();
    std::vector<std::string> dirs =
        distopt::PluginRegistry::search_path(cli_paths, cfg.plugin_paths);
    distopt::PluginRegistry registry;
    registry.discover(dirs);
    distopt::validate_job(cfg, registry);
    // A file with a train: section is for `distopt train`: refuse what it refuses.
    if (cfg.root.IsMap() && cfg.root["train"].IsDefined()) distopt::train::check_train_config(cfg);
    auto component = [](const distopt::ComponentConfig& c) {
      return c.name + (c.inner ? " (inner " + c.inner->name + ")" : "");
    };
    std::string algorithms, reducers;
    if (cfg.schedule.empty()) {
      algorithms = cfg.algorithm.name;
      reducers = component(cfg.reducer);
    } else {  // "allreduce until epoch 1, then decentralized"
      for (size_t k = 0; k < cfg.schedule.size(); ++k) {
        const distopt::SchedulePhase& ph = cfg.schedule[k];
        const std::string bound =
            ph.until_epoch >= 0  ? " until epoch " + std::to_string(ph.until_epoch)
            : ph.until_step >= 0 ? " until step " + std::to_string(ph.until_step)
                                 : "";
        algorithms += (k ? ", then " : "") + ph.algorithm.name + bound;
        reducers += (k ? ", then " : "") + component(ph.reducer) + bound;
      }
    }
    std::cout << path << ": OK (communicator " << cfg.communicator.name
              << (cfg.control_communicator.name.empty()
                      ? ""
                      : " + control " + cfg.control_communicator.name)
              << ", reducer " << reducers << ", algorithm " << algorithms << ", optimizer "
              << cfg.optimizer_name << ", world size " << cfg.world_size << ")\n";
    return 0;
  } catch (const distopt::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}

}  // namespace

DISTOPT_REGISTER_COMMAND("check", "validate a job YAML against the plugins' option schemas",
                         run_check);
