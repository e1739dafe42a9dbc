// The one writer of test job files: a job's YAML section by section, one
// line each, in a fixed order (tests assert file:line:column of config
// errors, so the order is part of the contract):
//   1 plugins   2 world   3 communicator   algorithm   reducer   optimizer
//   train   then `extra` verbatim
// A section left empty is left out, and the lines after it move up.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "multiproc.hpp"

namespace distopt::test {

/// The `train:` flow map of a job on the quickstart model: `{model: M,
/// epochs: E, batch_size: B, seed: S[, max_steps: N][, log_every: K],
/// threads: 1<more>}`.
struct TrainYaml {
  std::string model = "mlp";
  int epochs = 2;
  int batch_size = 128;
  int seed = 0;
  int max_steps = -1;  ///< steps per epoch; < 0 leaves the key out (0 = all)
  int log_every = -1;  ///< < 0 leaves the key out
  std::string more;    ///< further keys, each with its leading ", "

  std::string text() const {
    std::ostringstream y;
    y << "{model: " << model << ", epochs: " << epochs << ", batch_size: " << batch_size
      << ", seed: " << seed;
    if (max_steps >= 0) y << ", max_steps: " << max_steps;
    if (log_every >= 0) y << ", log_every: " << log_every;
    y << ", threads: 1" << more << "}";
    return y.str();
  }
};

/// A job file's YAML. The component sections are flow maps as written in the
/// file, e.g. `{name: sgd, lr: 0.1, momentum: 0.9}`.
struct JobYaml {
  /// `plugins: {paths: ['$DISTOPT_PLUGIN_DIR']}`; false leaves the section out.
  bool plugins = true;
  int world = 1;
  double timeout_s = 0;    ///< world.timeout_s in seconds; 0 leaves it out
  std::string rendezvous;  ///< world.rendezvous URL; "" leaves it out
  std::string communicator, algorithm, reducer, optimizer;
  std::optional<TrainYaml> train;  ///< nullopt leaves the section out
  std::string extra;               ///< further top-level YAML, newline-terminated

  /// The YAML text. Throws std::runtime_error if `plugins` is set and
  /// DISTOPT_PLUGIN_DIR is not (the test was not run through ctest).
  std::string text() const {
    std::ostringstream y;
    if (plugins) {
      const std::string dir = env_path("DISTOPT_PLUGIN_DIR");
      if (dir.empty())
        throw std::runtime_error("DISTOPT_PLUGIN_DIR is not set (run through ctest)");
      y << "plugins: {paths: ['" << dir << "']}\n";
    }
    y << "world: {size: " << world;
    if (!rendezvous.empty()) y << ", rendezvous: '" << rendezvous << "'";
    if (timeout_s > 0) y << ", timeout_s: " << timeout_s;
    y << "}\n";
    auto section = [&y](const char* key, const std::string& value) {
      if (!value.empty()) y << key << ": " << value << "\n";
    };
    section("communicator", communicator);
    section("algorithm", algorithm);
    section("reducer", reducer);
    section("optimizer", optimizer);
    if (train) section("train", train->text());
    y << extra;
    return y.str();
  }
};

/// The quickstart job most CLI tests vary: `world` ranks with a 60 s
/// timeout, SGD (lr 0.1, momentum 0.9), the MLP for 2 epochs of batch 128;
/// no communicator, algorithm or reducer (the defaults).
inline JobYaml quickstart_job(int world) {
  JobYaml j;
  j.world = world;
  j.timeout_s = 60;
  j.optimizer = "{name: sgd, lr: 0.1, momentum: 0.9}";
  j.train = TrainYaml{};
  return j;
}

/// quickstart_job with the components named: tcp, allreduce, mean.
inline JobYaml allreduce_job(int world) {
  JobYaml j = quickstart_job(world);
  j.communicator = "{name: tcp}";
  j.algorithm = "{name: allreduce}";
  j.reducer = "{name: mean}";
  return j;
}

/// Writes `job` to `path` (replacing it) and returns `path`; throws
/// std::runtime_error naming the file if it cannot be written.
inline std::string write_job(const std::string& path, const JobYaml& job) {
  std::ofstream f(path);
  f << job.text();
  if (!f.flush()) throw std::runtime_error("cannot write the job file " + path);
  return path;
}

}  // namespace distopt::test
