// Checkpoints as a user meets them: `distopt train --checkpoint DIR
// [--resume]` on real ranks, killed mid-training and mid-save, corrupt and
// truncated shards, and `distopt checkpoint consolidate` read back by C++
// and by Python's torch.load (Debian python3-torch).
#include <torch/serialize.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "distopt/checkpoint.hpp"
#include "torch_doctest.hpp"
// after doctest:
#include "cli_train_util.hpp"
#include "cli_util.hpp"
#include "job_yaml.hpp"
#include "train_metrics.hpp"

using distopt::test::ProcResult;
using distopt::test::run_command;
using namespace distopt::test::cli;

namespace {

const char* const kData = distopt::test::kFashionMnistDir;
struct Job {
  std::string algorithm = "{name: allreduce}";
  std::string optimizer = "{name: sgd, lr: 0.05, momentum: 0.9}";
  int max_steps = 30;
  int epochs = 1;
};

std::string write_job(const TempDir& t, const Job& j, const std::string& name = "job.yaml") {
  distopt::test::JobYaml y = distopt::test::allreduce_job(2);
  y.timeout_s = 30;
  y.algorithm = j.algorithm;
  y.optimizer = j.optimizer;
  distopt::test::TrainYaml& train = *y.train;
  train.epochs = j.epochs;
  train.batch_size = 32;
  train.seed = 3;
  train.max_steps = j.max_steps;
  train.log_every = 0;
  return distopt::test::write_job(t.file(name), y);
}

}  // namespace

TEST_CASE("a rank killed mid-training: --resume ends bitwise equal to an uninterrupted run") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string cfg = write_job(t, Job{});
  ProcResult a = train(cfg, {"--checkpoint", t.file("a")});
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CHECK(a.output.find("checkpoint: " + t.file("a") + "/step-000000030") != std::string::npos);

  const std::string b = t.file("b");
  ProcResult killed = train(cfg, {"--checkpoint", b, "--checkpoint-every", "10"},
                            {"DISTOPT_FAULT_INJECT=exit:1:25"});
  INFO(killed.output);
  CHECK(killed.exit_code != 0);
  CHECK(distopt::test::read_text(b + "/latest") == "step-000000020\n");
  auto info = distopt::find_checkpoint(b);
  REQUIRE(info.has_value());
  CHECK(info->step == 20);
  CHECK(info->world_size == 2);
  CHECK(info->extra.at("samples_in_epoch") == std::to_string(20 * 64));

  ProcResult resumed = train(cfg, {"--checkpoint", b, "--checkpoint-every", "10", "--resume"});
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("resume: " + b +
                            "/step-000000020 (step 20, saved by 2 rank(s)): "
                            "epoch 1, step 20 of 30") != std::string::npos);
  CHECK(resumed.output.find("summary: 2 rank(s), 10 steps") != std::string::npos);
  // keep = 2: the step-10 checkpoint is gone, 20 and 30 remain.
  CHECK_FALSE(distopt::test::path_exists(b + "/step-000000010"));
  CHECK(distopt::test::path_exists(b + "/step-000000020"));

  auto ca = consolidated(t.file("a"), t.file("a.pt"));
  auto cb = consolidated(b, t.file("b.pt"));
  CHECK(ca.at("step").toInt() == 30);
  CHECK(cb.at("step").toInt() == 30);
  check_equal_section(ca, cb, "model");
  check_equal_section(ca, cb, "optimizer_state");
}

TEST_CASE("a rank killed while writing its shard leaves the previous checkpoint the newest") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string cfg = write_job(t, Job{});
  ProcResult a = train(cfg, {"--checkpoint", t.file("a")});
  REQUIRE(a.exit_code == 0);

  const std::string c = t.file("c");
  ProcResult killed = train(cfg, {"--checkpoint", c, "--checkpoint-every", "10"},
                            {"DISTOPT_FAULT_INJECT=save:1:2"});
  INFO(killed.output);
  CHECK(killed.exit_code != 0);
  CHECK(distopt::test::read_text(c + "/latest") == "step-000000010\n");
  // The interrupted save: rank 1's shard never got its final name, no manifest.
  CHECK_FALSE(distopt::test::path_exists(c + "/step-000000020/manifest.json"));
  CHECK_FALSE(distopt::test::path_exists(c + "/step-000000020/rank-00001-of-00002.pt"));

  ProcResult resumed = train(cfg, {"--checkpoint", c, "--resume"});
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("epoch 1, step 10 of 30") != std::string::npos);
  auto ca = consolidated(t.file("a"), t.file("a.pt"));
  auto cc = consolidated(c, t.file("c.pt"));
  check_equal_section(ca, cc, "model");
}

TEST_CASE("corrupt, truncated and foreign checkpoints fail naming the file; nothing is written") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string cfg = write_job(t, Job{});
  const std::string d = t.file("d");
  ProcResult a = train(cfg, {"--checkpoint", d});
  REQUIRE(a.exit_code == 0);
  const std::string shard = d + "/step-000000030/rank-00001-of-00002.pt";
  const std::string good = distopt::test::read_text(shard);

  auto snapshot = [&] {
    std::map<std::string, std::string> files;
    for (const std::string& f : distopt::test::files_under(d))
      files[f] = distopt::test::read_text(f);
    return files;
  };
  auto expect_failure = [&](const std::string& what) {
    const auto before = snapshot();
    ProcResult r = run_command({cli(), "checkpoint", "consolidate", d, t.file("out.pt")}, {},
                               std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find(what) != std::string::npos);
    CHECK_FALSE(distopt::test::path_exists(t.file("out.pt")));
    ProcResult resume = train(cfg, {"--checkpoint", d, "--resume"});
    INFO(resume.output);
    CHECK(resume.exit_code != 0);
    CHECK(resume.output.find(what) != std::string::npos);
    CHECK(snapshot() == before);  // loading never writes
  };

  SUBCASE("a flipped byte") {
    std::string bad = good;
    bad[bad.size() / 2] ^= 0x40;
    std::ofstream(shard, std::ios::binary) << bad;
    expect_failure(shard + ": CRC-32 mismatch (the file is corrupt)");
  }
  SUBCASE("a truncated shard") {
    std::ofstream(shard, std::ios::binary) << good.substr(0, good.size() / 3);
    expect_failure(shard + ": " + std::to_string(good.size() / 3) + " bytes, the manifest says " +
                   std::to_string(good.size()));
  }
  SUBCASE("a missing shard") {
    std::remove(shard.c_str());
    expect_failure(shard + ": cannot open");
  }
  SUBCASE("a garbled manifest") {
    std::ofstream(d + "/step-000000030/manifest.json") << "{\"format\": 1";
    expect_failure(d + "/step-000000030/manifest.json" + ": invalid manifest");
  }
  SUBCASE("another model's checkpoint") {
    Job other;
    other.optimizer = "{name: adam, lr: 0.001}";
    const std::string cfg2 = write_job(t, other, "adam.yaml");
    ProcResult r = train(cfg2, {"--checkpoint", d, "--resume"});
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("saved with inner optimizer 'sgd', this job's is 'adam'") !=
          std::string::npos);
  }
}

TEST_CASE("a zero checkpoint consolidates into a file Python's torch.load reads") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  // The first Python that imports torch: $DISTOPT_PYTHON, Debian's
  // python3-torch, then the python3 on PATH (a PyTorch venv: the GPU machine).
  std::vector<std::string> pythons{"/usr/bin/python3", "python3"};
  if (const char* e = std::getenv("DISTOPT_PYTHON"); e && *e) pythons.insert(pythons.begin(), e);
  std::string python, tried;
  for (const std::string& p : pythons) {
    ProcResult py = run_command({p, "-c", "import torch"}, {}, std::chrono::seconds(120));
    if (py.exit_code == 0) {
      python = p;
      break;
    }
    tried += "\n" + p + ": " + py.output;
  }
  const std::string why =
      "Python's torch is missing (tools/setup.sh installs python3-torch):" + tried;
  REQUIRE_MESSAGE(!python.empty(), why);
  TempDir t;
  Job zero;
  zero.algorithm = "{name: zero, options: {stage: 1, partition: contiguous}}";
  zero.optimizer = "{name: adam, lr: 0.001}";
  zero.max_steps = 20;
  Job plain = zero;
  plain.algorithm = "{name: allreduce}";
  ProcResult z = train(write_job(t, zero, "zero.yaml"), {"--checkpoint", t.file("z")});
  INFO(z.output);
  REQUIRE(z.exit_code == 0);
  ProcResult p = train(write_job(t, plain, "plain.yaml"), {"--checkpoint", t.file("p")});
  INFO(p.output);
  REQUIRE(p.exit_code == 0);
  consolidated(t.file("z"), t.file("z.pt"));
  consolidated(t.file("p"), t.file("p.pt"));

  // ZeRO's sharded Adam state, gathered, equals plain allreduce's (to float
  // tolerance: the same steps on the same data).
  const std::string script = R"(
import sys, torch
# weights_only=True (torch.load's default from PyTorch 2.6; the argument
# exists from 1.13): the file holds tensors and plain containers only.
z = torch.load(sys.argv[1], weights_only=True); p = torch.load(sys.argv[2], weights_only=True)
assert z["format"] == "distopt-consolidated-1", z["format"]
assert z["algorithm"] == "zero/zero" and p["algorithm"] == "allreduce/allreduce"
assert z["step"] == 20 and z["world_size"] == 2 and z["optimizer"] == "adam"
assert set(z["model"]) == set(p["model"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}, sorted(z["model"])
assert z["model"]["fc1.weight"].shape == (512, 784), z["model"]["fc1.weight"].shape
for k in p["model"]:
    assert torch.allclose(z["model"][k], p["model"][k], atol=1e-5), k
assert set(z["optimizer_state"]) == set(p["model"])
for name, st in p["optimizer_state"].items():
    for field in ("exp_avg", "exp_avg_sq"):
        assert st[field].shape == p["model"][name].shape, (name, field)
        assert torch.allclose(z["optimizer_state"][name][field], st[field], atol=1e-6), (name, field)
    assert int(z["optimizer_state"][name]["step"]) == 20
print("python ok", len(z["model"]), "tensors")
)";
  ProcResult check = run_command({python, "-c", script, t.file("z.pt"), t.file("p.pt")}, {},
                                 std::chrono::seconds(120));
  INFO(check.output);
  CHECK(check.exit_code == 0);
  CHECK(check.output.find("python ok 6 tensors") != std::string::npos);
}

TEST_CASE("consolidate to a bare file name writes it in the current directory") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  ProcResult a = train(write_job(t, Job{}), {"--checkpoint", t.file("ck1")});
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  // The user guide's form (GUIDE.md "Checkpoints"), run from the directory that holds ck1: the
  // directory sync after the rename must sync ".", not "".
  ProcResult r =
      run_command({"/bin/sh", "-c", "cd \"$1\" && exec \"$2\" checkpoint consolidate ck1 model.pt",
                   "sh", t.path, cli()},
                  {}, std::chrono::seconds(120));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("cannot open directory") == std::string::npos);
  const std::string bytes = distopt::test::read_text(t.file("model.pt"));
  REQUIRE_FALSE(bytes.empty());
  const auto bare =
      torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  CHECK(bare.at("format").toStringRef() == "distopt-consolidated-1");
  // The same content as through an absolute path; no temporary file is left.
  check_equal_section(bare, consolidated(t.file("ck1"), t.file("abs.pt")), "model");
  for (const std::string& name : distopt::test::list_dir(t.path))
    CHECK(name.find(".tmp-") == std::string::npos);
}

TEST_CASE("a zero checkpoint of 2 ranks resumes on 4 (resharded)") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  Job zero;
  zero.algorithm = "{name: zero, options: {stage: 2}}";
  zero.optimizer = "{name: adam, lr: 0.001}";
  zero.max_steps = 40;
  const std::string cfg = write_job(t, zero);
  ProcResult first = train(cfg, {"--checkpoint", t.file("z"), "--checkpoint-every", "20"},
                           {"DISTOPT_FAULT_INJECT=exit:0:25"});
  CHECK(first.exit_code != 0);
  ProcResult r = train(cfg, {"--checkpoint", t.file("z"), "--resume", "--world-size", "4"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("saved by 2 ranks, loading into 4 (resharding)") != std::string::npos);
  // 20 samples-worth of 64-image batches = 1280 samples = 10 global batches of 128.
  CHECK(r.output.find("epoch 1, step 10 of 40") != std::string::npos);
  CHECK(r.output.find("summary: 4 rank(s), 30 steps") != std::string::npos);
  auto info = distopt::find_checkpoint(t.file("z"));
  REQUIRE(info.has_value());
  CHECK(info->world_size == 4);
}
