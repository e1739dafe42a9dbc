// The checkpoint CLI for any step: `checkpoint info` lists every step and takes
// a step directory or --step N, `consolidate` the same, `train --resume-from`;
// `--help` on every subcommand, the top-level help, `--version`.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

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

const char* const kData = distopt::test::kFashionMnistDir;

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

std::string write_job(const TempDir& t) {
  distopt::test::JobYaml j = distopt::test::allreduce_job(1);
  j.timeout_s = 0;  // the default
  j.optimizer = "{name: adam, lr: 0.001}";
  j.train->epochs = 1;
  j.train->batch_size = 64;
  j.train->max_steps = 12;
  j.train->log_every = 4;
  j.train->more = std::string(", data_dir: ") + kData;
  return distopt::test::write_job(t.file("job.yaml"), j);
}

double final_accuracy(const std::string& metrics) {
  std::ifstream f(metrics);
  json last;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) last = json::parse(line);
  REQUIRE_MESSAGE(last.is_object(), metrics << " has no metrics");
  return last["final_test_accuracy"].get<double>();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("every subcommand has --help; the top level lists them all; --version") {
  ProcResult top = run_command({cli(), "--help"});
  CHECK(top.exit_code == 0);
  for (const char* c : {"train", "launch", "check", "checkpoint", "plugins", "bench", "bench comm",
                        "bench step", "info", "consolidate", "--version"})
    CHECK_MESSAGE(contains(top.output, c), c << " missing from:\n" << top.output);
  for (std::vector<std::string> argv : {std::vector<std::string>{"checkpoint", "--help"},
                                        {"checkpoint", "info", "--help"},
                                        {"checkpoint", "consolidate", "--help"},
                                        {"checkpoint", "info", "-h"},
                                        {"launch", "--help"},
                                        {"train", "--help"},
                                        {"check", "--help"},
                                        {"plugins", "--help"},
                                        {"bench", "--help"},
                                        {"bench", "comm", "--help"},
                                        {"bench", "step", "--help"}}) {
    argv.insert(argv.begin(), cli());
    ProcResult r = run_command(argv);
    INFO(argv[1] << " " << argv[2] << ":\n" << r.output);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "distopt " + argv[1]));  // its own help, not the top level's
    CHECK_FALSE(contains(r.output, ": error:"));
  }
  ProcResult v = run_command({cli(), "--version"});
  CHECK(v.exit_code == 0);
  CHECK(contains(v.output, "distopt 0."));
  ProcResult bad = run_command({cli(), "checkpoint", "inf", "x"});
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "unknown subcommand 'inf'"));
}

TEST_CASE("checkpoint info / consolidate / train --resume-from take any step") {
  DISTOPT_SKIP_WITHOUT_FASHION_MNIST();
  TempDir t;
  const std::string job = write_job(t);
  const std::string ck = t.file("ck");
  const std::string m0 = t.file("m0.jsonl");
  ProcResult r = run_command({cli(), "train", job, "--checkpoint", ck, "--checkpoint-every", "4",
                              "--keep", "5", "--metrics", m0},
                             {}, std::chrono::seconds(300));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string s4 = ck + "/step-000000004", s8 = ck + "/step-000000008";

  // info: every step, the newest described.
  ProcResult info = run_command({cli(), "checkpoint", "info", ck});
  INFO(info.output);
  CHECK(info.exit_code == 0);
  CHECK(contains(info.output, "step 4  world size 1  " + s4));
  CHECK(contains(info.output, "step 8  world size 1  " + s8));
  CHECK(contains(info.output, "(latest)"));
  CHECK(contains(info.output, "  step: 12\n"));
  // A step directory, or --step N: that one.
  info = run_command({cli(), "checkpoint", "info", s4 + "/"});
  CHECK(info.exit_code == 0);
  CHECK(contains(info.output, "  step: 4\n"));
  info = run_command({cli(), "checkpoint", "info", ck, "--step", "8"});
  CHECK(info.exit_code == 0);
  CHECK(contains(info.output, "checkpoint: " + s8));
  info = run_command({cli(), "checkpoint", "info", ck, "--step", "5"});
  CHECK(info.exit_code == 1);
  CHECK(contains(info.output, "no checkpoint of step 5 (steps there: 4, 8, 12"));
  info = run_command({cli(), "checkpoint", "info", t.file("nothing")});
  CHECK(info.exit_code == 1);
  CHECK(contains(info.output, t.file("nothing")));

  // consolidate: any step; different steps, different files.
  ProcResult c4 =
      run_command({cli(), "checkpoint", "consolidate", ck, t.file("c4.pt"), "--step", "4"});
  CHECK(c4.exit_code == 0);
  CHECK(contains(c4.output, "(step 4, " + s4 + ")"));
  ProcResult c8 = run_command({cli(), "checkpoint", "consolidate", s8, t.file("c8.pt")});
  CHECK(c8.exit_code == 0);
  CHECK(contains(c8.output, "(step 8, " + s8 + ")"));
  ProcResult c8b =
      run_command({cli(), "checkpoint", "consolidate", ck, t.file("c8b.pt"), "--step", "8"});
  CHECK(c8b.exit_code == 0);
  CHECK(slurp(t.file("c8.pt")) == slurp(t.file("c8b.pt")));
  CHECK_FALSE(slurp(t.file("c4.pt")).empty());
  CHECK(slurp(t.file("c4.pt")) != slurp(t.file("c8.pt")));

  // --resume-from a step directory (no --checkpoint: nothing saved), then a
  // step number of --checkpoint DIR: both end where the uninterrupted run did.
  const std::string m1 = t.file("m1.jsonl");
  r = run_command({cli(), "train", job, "--resume-from", s8, "--metrics", m1}, {},
                  std::chrono::seconds(300));
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "resume: " + s8 + " (step 8"));
  CHECK(final_accuracy(m1) == final_accuracy(m0));
  const std::string m2 = t.file("m2.jsonl");
  r = run_command({cli(), "train", job, "--checkpoint", ck, "--resume-from", "4", "--metrics", m2},
                  {}, std::chrono::seconds(300));
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "resume: " + s4 + " (step 4"));
  CHECK(final_accuracy(m2) == final_accuracy(m0));

  // Errors name the option.
  r = run_command({cli(), "train", job, "--checkpoint", ck, "--resume-from", "5"});
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "no checkpoint of step 5"));
  r = run_command({cli(), "train", job, "--resume-from", "5"});
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "--resume-from 5 (a step) needs --checkpoint DIR"));
  r = run_command({cli(), "train", job, "--resume-from", t.file("nothing")});
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "--resume-from " + t.file("nothing") + ": no checkpoint"));
}
