// A job's life as a new user meets it, on real processes: a job file
// without `world:` under `distopt launch` (one launcher, and two launchers
// of one host, whose ranks must split the cores between them), resuming a
// run that is already complete, `--resume-from` an earlier step (the
// abandoned newer checkpoints go; --metrics appends), a warm-up longer than
// the run caught by `distopt check`, and a component that never returns
// (the watchdog names the rank, the component and the operation).
#include <doctest/doctest.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "skip.hpp"

using distopt::test::env_path;
using distopt::test::list_dir;
using distopt::test::ProcResult;
using distopt::test::random_port;
using distopt::test::run_command;
using namespace distopt::test::cli;
using nlohmann::json;

namespace {

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// A small synthetic job (no data files), with no `world:` section unless
// `world` is given, and no train.threads (the threads are the runtime's choice).
std::string job_text(const std::string& world = "", const std::string& extra = "",
                     const std::string& reducer = "mean") {
  const std::string plugins = env_path("DISTOPT_PLUGIN_DIR");
  REQUIRE_MESSAGE(!plugins.empty(), "DISTOPT_PLUGIN_DIR is not set (run through ctest)");
  std::string y = "plugins: {paths: ['" + plugins + "'" + extra + "]}\n";
  if (!world.empty()) y += "world: " + world + "\n";
  y += "communicator: tcp\nreducer: " + reducer + "\nalgorithm: allreduce\n";
  y += "optimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n";
  y += "train: {model: mlp, dataset: synthetic, synthetic: {train_samples: 1024, test_samples: "
       "256, channels: 1, height: 8, width: 8, noise: 0.5}, epochs: 1, batch_size: 64, "
       "max_steps: 6, log_every: 3, seed: 1}\n";
  return y;
}

std::string write(const TempDir& t, const std::string& name, const std::string& text) {
  std::ofstream f(t.file(name));
  f << text;
  REQUIRE(f.flush());
  return t.file(name);
}

int cores_here() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  return std::max(1, CPU_COUNT(&set));
}

// "N thread(s) per rank" from rank 0's header, or -1.
int threads_per_rank(const std::string& out) {
  std::smatch m;
  std::regex re(R"((\d+) thread\(s\) per rank)");
  return std::regex_search(out, m, re) ? std::stoi(m[1]) : -1;
}

// The last "final test accuracy: X%" or "test accuracy X%" figure printed.
std::string last_accuracy(const std::string& out) {
  std::regex re(R"(test accuracy:? ([0-9.]+)%)");
  std::string last;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) last = (*it)[1];
  return last;
}

std::vector<json> events(const std::string& metrics) {
  std::ifstream f(metrics);
  std::vector<json> out;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::vector<std::string> step_dirs(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& n : list_dir(dir))
    if (n.rfind("step-", 0) == 0) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("a job without world: runs under distopt launch -n 2") {
  TempDir t;
  const std::string job = write(t, "job.yaml", job_text());
  ProcResult r = run_command({cli(), "launch", "-n", "2", "--", cli(), "train", job}, {},
                             std::chrono::seconds(240));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "distopt train: 2 rank(s)"));
  CHECK(!contains(r.output, "invalid node"));
  CHECK(!contains(r.output, "world.size is"));  // no world.size written: nothing to warn of
  CHECK(threads_per_rank(r.output) == std::max(1, cores_here() / 2));
}

TEST_CASE("two launchers on one host: the job runs, and their ranks split the host's cores") {
  TempDir t;
  const std::string job = write(t, "job.yaml", job_text());
  const int port = random_port();
  std::vector<std::unique_ptr<Background>> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.push_back(std::make_unique<Background>(std::vector<std::string>{
        cli(), "launch", "--nnodes", "2", "--node-rank", std::to_string(node), "-n", "1",
        "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--", cli(), "train", job}));
  std::string out0;
  for (int node = 0; node < 2; ++node) {
    const int code = nodes[node]->wait(std::chrono::seconds(240));
    INFO("node " << node << ":\n" << nodes[node]->output);
    CHECK(code == 0);
    if (node == 0) out0 = nodes[node]->output;
  }
  INFO(out0);
  CHECK(contains(out0, "distopt train: 2 rank(s)"));
  // Each launcher alone would give its one rank every core.
  CHECK(threads_per_rank(out0) == std::max(1, cores_here() / 2));
}

TEST_CASE(
    "resume: a complete run reports its restored model; --resume-from drops the newer "
    "checkpoints; --metrics appends") {
  TempDir t;
  const std::string job = write(t, "job.yaml", job_text("{size: 2}"));
  const std::string ck = t.file("ck"), m = t.file("m.jsonl");
  const auto train = [&](std::vector<std::string> more) {
    std::vector<std::string> argv = {cli(), "train", job, "--checkpoint", ck, "--metrics", m};
    argv.insert(argv.end(), more.begin(), more.end());
    return run_command(argv, {}, std::chrono::seconds(240));
  };
  // Steps 2, 4 and 6 (the epoch's end) are saved and kept.
  ProcResult first = train({"--checkpoint-every", "2", "--keep", "10"});
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const std::string accuracy = last_accuracy(first.output);
  REQUIRE(!accuracy.empty());
  CHECK(step_dirs(ck) ==
        std::vector<std::string>{"step-000000002", "step-000000004", "step-000000006"});

  ProcResult again = train({"--resume"});
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(contains(again.output, "the run is complete"));
  CHECK(!contains(again.output, "0.00%"));
  CHECK(last_accuracy(again.output) == accuracy);  // the restored model, evaluated

  ProcResult back = train({"--resume-from", "2", "--checkpoint-every", "2", "--keep", "10"});
  INFO(back.output);
  CHECK(back.exit_code == 0);
  CHECK(last_accuracy(back.output) == accuracy);  // the same steps again: the same model
  // One directory per step: the abandoned step 6 went when the new one was saved.
  const auto dirs = step_dirs(ck);
  std::set<std::string> steps;
  for (const auto& d : dirs) steps.insert(d.substr(0, 14));
  CHECK(dirs.size() == 3);
  CHECK(steps == std::set<std::string>{"step-000000002", "step-000000004", "step-000000006"});
  ProcResult info = run_command({cli(), "checkpoint", "info", ck});
  INFO(info.output);
  CHECK(info.exit_code == 0);

  // distopt eval: the newest checkpoint is the run's final model; an
  // earlier step is another model, evaluated without training.
  ProcResult ev =
      run_command({cli(), "eval", job, "--checkpoint", ck}, {}, std::chrono::seconds(240));
  INFO(ev.output);
  CHECK(ev.exit_code == 0);
  CHECK(contains(ev.output, "eval: "));
  CHECK(last_accuracy(ev.output) == accuracy);
  ev = run_command({cli(), "eval", job, "--checkpoint", ck, "--step", "2", "--world-size", "1"}, {},
                   std::chrono::seconds(240));
  INFO(ev.output);
  CHECK(ev.exit_code == 0);
  CHECK(contains(ev.output, "step-000000002"));
  CHECK(contains(ev.output, "optimizer step 2)"));
  CHECK(!last_accuracy(ev.output).empty());
  ev = run_command({cli(), "eval", job, "--checkpoint", t.file("nothing")});
  CHECK(ev.exit_code != 0);
  CHECK(contains(ev.output, "no checkpoint"));

  // The history of all three runs, in order.
  std::vector<std::string> kinds;
  for (const json& e : events(m))
    if (e["event"] == "summary" || e["event"] == "evaluation" || e["event"] == "resume")
      kinds.push_back(e["event"]);
  CHECK(kinds == std::vector<std::string>{"summary", "resume", "evaluation", "resume", "summary"});
  // Per-step records every train.log_every (3) steps: steps 3 and 6 of each training run.
  std::vector<int> logged;
  for (const json& e : events(m))
    if (e["event"] == "step") {
      logged.push_back(e["global_step"].get<int>());
      CHECK(e.contains("loss"));
      CHECK(e.contains("lr"));
      CHECK(e.contains("samples_per_s"));
      CHECK(e.contains("bytes_sent"));
      CHECK(e.contains("loss_scale"));
    }
  CHECK(logged == std::vector<int>{3, 6, 3, 6});

  // tools/plot_metrics.py draws the file (and a second one beside it) into a PNG.
  if (run_command({"/usr/bin/python3", "-c", "import matplotlib"}).exit_code != 0)
    DISTOPT_SKIP_TEST_CASE("no matplotlib for /usr/bin/python3 (tools/setup.sh installs it)");
  const std::string png = t.file("curves.png");
  ProcResult plot =
      run_command({"/usr/bin/python3", env_path("DISTOPT_SOURCE_DIR") + "/tools/plot_metrics.py", m,
                   m, "--label", "a", "--label", "b", "-o", png},
                  {}, std::chrono::seconds(120));
  INFO(plot.output);
  CHECK(plot.exit_code == 0);
  std::ifstream f(png, std::ios::binary);
  std::string head(8, '\0');
  f.read(&head[0], 8);
  CHECK(head == std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST_CASE("distopt check refuses a warm-up longer than the run") {
  TempDir t;
  std::string text = job_text("{size: 2}");
  text.replace(text.find("momentum: 0.9}"), 14,
               "momentum: 0.9, lr_schedule: {name: cosine, warmup_steps: 100}}");
  const std::string job = write(t, "job.yaml", text);
  ProcResult r = run_command({cli(), "check", job});
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(contains(r.output,
                 "optimizer.lr_schedule.warmup_steps (100) must be below the run's 6 "
                 "optimizer steps"));
  // Within the run it passes.
  text.replace(text.find("warmup_steps: 100"), 17, "warmup_steps: 2");
  write(t, "job.yaml", text);
  r = run_command({cli(), "check", job});
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

TEST_CASE(
    "a component that never returns: the watchdog names the rank, the component and the "
    "operation, and the job ends") {
  const std::string hang_dir = env_path("DISTOPT_HANG_PLUGIN_DIR");
  REQUIRE_MESSAGE(!hang_dir.empty(), "DISTOPT_HANG_PLUGIN_DIR is not set (run through ctest)");
  TempDir t;
  const std::string job = write(
      t, "job.yaml",
      job_text("{size: 2, timeout_s: 30, watchdog_s: 4}", ", '" + hang_dir + "'", "hang_test"));
  const auto t0 = std::chrono::steady_clock::now();
  ProcResult r = run_command({cli(), "train", job}, {}, std::chrono::seconds(180));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.exit_code != -1);  // it ended by itself, before this test's timeout
  CHECK(contains(r.output,
                 "watchdog: algorithm 'allreduce' with reducer 'hang_test' in "
                 "on_bucket_ready of bucket"));
  CHECK(contains(r.output, "past world.watchdog_s = 4 s"));
  CHECK(std::regex_search(r.output, std::regex(R"(distopt: rank [01]: watchdog)")));
  CHECK(seconds < 170);
}

TEST_CASE("on a terminal the step lines are one progress line per epoch; in a pipe, lines") {
  if (run_command({"sh", "-c", "command -v script"}).exit_code != 0)
    DISTOPT_SKIP_TEST_CASE("no script(1) to give the run a terminal (bsdutils)");
  TempDir t;
  for (const std::string world : {"{size: 2}", "{size: 1}"}) {
    CAPTURE(world);
    const std::string job = write(t, "job.yaml", job_text(world));
    // script(1): the command's stdout is a pseudo-terminal, as in a shell.
    ProcResult tty = run_command({"script", "-qec", cli() + " train " + job, "/dev/null"}, {},
                                 std::chrono::seconds(240));
    INFO(tty.output);
    CHECK(tty.exit_code == 0);
    const std::string prefix = world == "{size: 2}" ? "[rank 0] " : "";
    // Each step line is drawn over the last, the epoch's result over it.
    CHECK(contains(tty.output, "\r\x1b[K" + prefix + "epoch 1/1 step 3/6 loss"));
    CHECK(contains(tty.output, "\r\x1b[K" + prefix + "epoch 1/1 step 6/6 loss"));
    CHECK(contains(tty.output, "\r\x1b[K" + prefix + "epoch 1/1: train loss"));
    CHECK(std::regex_search(tty.output, std::regex(R"(step 3/6 loss .* eta \d+ s)")));
    ProcResult pipe = run_command({cli(), "train", job}, {}, std::chrono::seconds(240));
    INFO(pipe.output);
    CHECK(pipe.exit_code == 0);
    CHECK(contains(pipe.output, prefix + "epoch 1/1 step 3/6 loss"));
    CHECK(!contains(pipe.output, "\r"));
    CHECK(!contains(pipe.output, "\x1b["));
  }
}
