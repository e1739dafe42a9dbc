// Test helpers for a forked rank that builds its own distopt::Runtime from
// YAML text: the job's plugins / world lines for a loopback rendezvous
// (written by job_yaml.hpp, as every test job is), and
// the Runtime of rank `rank` of `world` (single host: local rank = rank).
#pragma once

#include <string>

#include "distopt/config.hpp"
#include "distopt/runtime.hpp"
#include "job_yaml.hpp"
#include "multiproc.hpp"

namespace distopt::test {

/// The `plugins:` (the build's plugin directory) and `world:` (size `world`,
/// rendezvous on 127.0.0.1:`port`, 60 s timeout) lines of a job's YAML.
inline std::string plugins_and_world_yaml(int world, int port) {
  JobYaml j;
  j.world = world;
  j.rendezvous = "tcp://127.0.0.1:" + std::to_string(port);
  j.timeout_s = 60;
  return j.text();
}

/// The Runtime of rank `rank` of `world` processes on one host, from the job
/// YAML `yaml` (`name` is the file name config errors mention).
inline distopt::Runtime rank_runtime(const std::string& yaml, int rank, int world,
                                     const std::string& name = "job.yaml") {
  distopt::ProcessInfo proc;
  proc.rank = proc.local_rank = rank;
  proc.world_size = proc.local_world_size = world;
  proc.source = "test";
  return distopt::Runtime::from_config(distopt::parse_job_config(yaml, name), proc);
}

}  // namespace distopt::test
