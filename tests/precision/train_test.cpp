// `distopt train` with a `precision:` section: bf16 against fp32 on the same
// job (2 ranks x 2 epochs, mlp, batch 256, SGD lr 0.1 momentum 0.9), its
// console and JSON metrics, and fp16 refused on CPU with a clear error.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "job_yaml.hpp"
#include "train_metrics.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using namespace distopt::test::cli;
using nlohmann::json;

namespace {

std::string write_job(const TempDir& t, const std::string& name, const std::string& precision,
                      int epochs, int max_steps, const std::string& algorithm = "") {
  distopt::test::JobYaml j = distopt::test::allreduce_job(2);
  if (!algorithm.empty()) j.algorithm = algorithm;
  j.train->epochs = epochs;
  j.train->batch_size = 256;
  j.train->max_steps = max_steps;
  j.train->log_every = 0;
  if (!precision.empty()) j.extra = "precision:\n" + precision;
  return distopt::test::write_job(t.file(name), j);
}

json summary_of(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  json last;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) last = json::parse(line);
  return last;
}

}  // namespace

TEST_CASE("bf16 training on 2 ranks reaches within 1 point of fp32 test accuracy") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string m32 = t.file("fp32.jsonl"), m16 = t.file("bf16.jsonl");
  ProcResult r32 =
      run_command({cli(), "train", write_job(t, "fp32.yaml", "", 2, 0), "--metrics", m32}, {},
                  std::chrono::seconds(280));
  INFO(r32.output);
  REQUIRE(r32.exit_code == 0);
  ProcResult r16 = run_command(
      {cli(), "train", write_job(t, "bf16.yaml", "  dtype: bf16\n", 2, 0), "--metrics", m16}, {},
      std::chrono::seconds(280));
  INFO(r16.output);
  REQUIRE(r16.exit_code == 0);

  CHECK(r32.output.find("precision: fp32\n") != std::string::npos);
  CHECK(
      r16.output.find("precision: bf16 (fp32 master weights, loss scale dynamic, initial 65536)") !=
      std::string::npos);
  CHECK(r16.output.find("precision: bf16, final loss scale 65536, skipped steps 0") !=
        std::string::npos);

  json s32 = summary_of(m32), s16 = summary_of(m16);
  REQUIRE(s32["event"] == "summary");
  REQUIRE(s16["event"] == "summary");
  CHECK(s32["dtype"] == "fp32");
  CHECK(s32["mixed_precision"] == false);
  CHECK(s32["final_loss_scale"] == 1.0);
  CHECK(s16["dtype"] == "bf16");
  CHECK(s16["mixed_precision"] == true);
  // 2 x 117 steps < growth_interval 2000 and bf16 has fp32's range: no overflow.
  CHECK(s16["final_loss_scale"] == 65536.0);
  CHECK(s16["skipped_steps"] == 0);
  CHECK(s16["steps"] == s32["steps"]);
  // The reducer moves the same fp32 buckets either way.
  CHECK(s16["bytes_sent_per_rank"] == s32["bytes_sent_per_rank"]);
  const double a32 = s32["final_test_accuracy"].get<double>(),
               a16 = s16["final_test_accuracy"].get<double>();
  MESSAGE("test accuracy after 2 epochs: fp32 "
          << 100 * a32 << "%, bf16 " << 100 * a16 << "%; samples/s fp32 "
          << s32["samples_per_s"].get<double>() << ", bf16 " << s16["samples_per_s"].get<double>());
  CHECK(a32 > 0.8);
  CHECK(std::abs(a16 - a32) <= 0.01);
}

TEST_CASE("bf16 with zero stage 3 (sharded fp32 masters) on 2 ranks trains as bf16 allreduce") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string ma = t.file("allreduce.jsonl"), mz = t.file("zero3.jsonl");
  auto train = [&](const std::string& name, const std::string& algorithm,
                   const std::string& metrics) {
    ProcResult r =
        run_command({cli(), "train", write_job(t, name, "  dtype: bf16\n", 1, 0, algorithm),
                     "--metrics", metrics},
                    {}, std::chrono::seconds(280));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  train("allreduce.yaml", "", ma);
  // The mlp's layers are units (distopt train's built-in models).
  ProcResult z = train("zero3.yaml", "{name: zero, options: {stage: 3}}", mz);
  CHECK(z.output.find("precision: bf16, final loss scale 65536, skipped steps 0") !=
        std::string::npos);
  json sa = summary_of(ma), sz = summary_of(mz);
  REQUIRE(sz["event"] == "summary");
  CHECK(sz["mixed_precision"] == true);
  CHECK(sz["steps"] == sa["steps"]);
  // The same fp32 SGD update of the same averaged fp32 gradients, split by
  // rank, and gathers that round the fp32 masters to bf16 as allreduce's
  // copy to the model does: a shard stepped twice, a gather of stale or
  // unrounded values, or a wrong unscale moves the loss far more than 1e-4.
  const double az = sz["final_test_accuracy"].get<double>(),
               aa = sa["final_test_accuracy"].get<double>();
  MESSAGE("bf16 test accuracy after 1 epoch: allreduce " << 100 * aa << "%, zero stage 3 "
                                                         << 100 * az << "%");
  CHECK(aa > 0.78);
  CHECK(std::abs(az - aa) <= 0.0005);
  CHECK(sz["final_test_loss"].get<double>() ==
        doctest::Approx(sa["final_test_loss"].get<double>()).epsilon(1e-4));
}

TEST_CASE("fp16 on this CPU-only build fails at start with a clear error") {
  TempDir t;
  // Line 9 of the job file holds `dtype: fp16` (col 10).
  const std::string job = write_job(t, "fp16.yaml", "  dtype: fp16\n", 1, 2);
  ProcResult r = run_command({cli(), "train", job}, {}, std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find(job + ":9:10: precision.dtype: fp16 needs a GPU") != std::string::npos);
  CHECK(r.output.find("use dtype: bf16, which runs on CPU") != std::string::npos);
  CHECK(r.output.find("epoch") == std::string::npos);  // refused before any training
}

TEST_CASE("distopt check reports a bad precision section with file:line:col") {
  TempDir t;
  const std::string job = write_job(t, "bad.yaml", "  dtype: bf16\n  backoff_factor: 2\n", 1, 2);
  ProcResult r = run_command({cli(), "check", job}, {}, std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find(job + ":10:19: precision.backoff_factor: value 2 is out of range (0, 1)") !=
        std::string::npos);
}
