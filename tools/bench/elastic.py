#!/usr/bin/python3
"""Elastic training: what a rank failure and the in-memory commits cost, in one run.

The job: mlp 784-512-256-10 on the Fashion-MNIST IDX files, 4 ranks (--world)
on 127.0.0.1 started by `distopt train` itself, tcp, mean, Adam (lr 0.002),
1 thread per rank, --batch per rank (train.global_batch_size = batch x ranks,
kept when a rank is lost), one epoch of --steps (or --recovery-steps) steps;
algorithms allreduce and zero {stage: 1} (--algorithms). Rows per algorithm:

  none          elastic off, no checkpoints: the baseline step time;
  elastic ce=K  `elastic: {enabled: true, commit_every: K}` for each K of
                --commit-every: a rank (--victim, not 0) killed at global step
                --kill-step (DISTOPT_FAULT_INJECT=exit:RANK:STEP), the
                survivors roll back to the last in-memory commit and go on;
  disk every K  elastic off, `--checkpoint DIR --checkpoint-every K`, the same
                rank killed at the same step: the job stops, and is started
                again at once with `--resume --world-size W-1` (TorchElastic's
                recipe: restart every worker from the last disk checkpoint).

Columns:
  kill -> next step  seconds from the kill to the first step rank 0 completes
          after it, timed from outside: the launcher's stdout and stderr read
          line by line, each line stamped with time.monotonic() on arrival
          (train.log_every: 1). The kill is the victim's own line "exits
          (137) at step N", written just before its _exit(137). For the disk
          row it spans the first job stopping, the second starting (processes,
          rendezvous, checkpoint load) and its first step; no scheduler delay.
  phases  where that time goes, from the arrival of rank 0's lines (elastic
          runs with DISTOPT_LOG_LEVEL=debug): detect (kill -> "elastic:
          recovering") / agree (-> "generation G has N rank(s)") / rebuild
          (-> "communicators and optimizer rebuilt") / restore (-> "elastic:
          generation G: ... go on") / step (-> the first step line); disk:
          stop (kill -> first job exited) / load (-> "resume:") / step.
  recovery (printed)  the "after X s" of rank 0's recovery line (the
          recovery event's seconds: from the start of Elastic::recover() to
          the state restored; detection and the first step are not in it).
  steps redone  optimizer steps completed before the kill that are done
          again: (kill step - 1) - the step restored (the recovery event's
          step, or the checkpoint's). The step the victim died in was never
          completed by anyone (its collective needs the victim), so it is
          not counted. 0..K-1 for commits or checkpoints every K steps.
  ms/step  failure-free runs of --epochs x --steps steps (log_every: 0): global batch /
          the summary's samples/s (training steps only, commits and disk
          checkpoints included, evaluation excluded).
  cost    ms/step against the baseline's run of the same repetition (seconds
          apart), as a fraction of the baseline's step and in ms per step:
          median over repetitions (min-max); "fastest": the fastest run of the
          row against the fastest baseline run (the least disturbed by other
          load on a shared machine).

Every run of every row and algorithm is repeated --repeat times, interleaved
(so load drift hits all rows alike); cells give the median (min-max).

    tools/bench/elastic.py [--distopt build/bin/distopt] [--plugin-path build/plugins]
        [--algorithms allreduce,zero] [--world 4] [--batch 96] [--steps 150] [--epochs 2]
        [--recovery-steps 40] [--kill-step 20] [--victim 2] [--commit-every 1,4]
        [--checkpoint-every 4] [--repeat 3] [--json FILE] [--verbose]

Needs only python3 and a build (distopt and its plugins).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALGORITHMS = {"allreduce": "{name: allreduce}", "zero": "{name: zero, options: {stage: 1}}"}
STEP_LINE = re.compile(r"^\[rank 0\] epoch \d+/\d+ step (\d+)/\d+ ")


def job_text(a, algorithm, commit_every, steps, log_every, epochs=1):
    """A job file (see the module's doc); commit_every None = elastic off."""
    text = (f"world: {{size: {a.world}, timeout_s: 60}}\n"
            "communicator: {name: tcp}\n"
            f"algorithm: {ALGORITHMS[algorithm]}\n"
            "reducer: {name: mean}\n"
            "optimizer: {name: adam, lr: 0.002}\n"
            f"train: {{model: mlp, epochs: {epochs}, batch_size: {a.batch}, seed: 5, max_steps: {steps}, "
            f"log_every: {log_every}, threads: 1, global_batch_size: {a.batch * a.world}, data_dir: '{a.data}'}}\n")
    if commit_every is not None:
        text += f"elastic: {{enabled: true, commit_every: {commit_every}}}\n"
    return text


class Run:
    """One `distopt train`: its output lines, each with its arrival time (time.monotonic())."""

    def __init__(self, a, label, cfg, args, env):
        self.label = label
        argv = [a.distopt, "train", cfg] + args
        for p in a.plugin_path:
            argv += ["--plugin-path", p]
        self.start = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=dict(os.environ, OMP_NUM_THREADS="1", **env))
        self.lines = []
        # readline returns as soon as a whole line arrived (the launcher relays
        # every rank's lines as they come and writes its own unbuffered).
        for raw in iter(p.stdout.readline, b""):
            t = time.monotonic()
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append((t, line))
            if a.verbose:
                print(f"{t - self.start:8.3f} {line}", file=sys.stderr)
        self.rc = p.wait()
        self.end = time.monotonic()

    def fail(self, why):
        tail = "\n".join(l for _, l in self.lines[-40:])
        raise SystemExit(f"{self.label}: {why} (exit code {self.rc}); last lines:\n{tail}")

    def first(self, pred, after=None, what=""):
        """Arrival time and text of the first line matching pred (at or after time `after`)."""
        for t, line in self.lines:
            if (after is None or t >= after) and pred(line):
                return t, line
        self.fail("no line " + what)


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_cost(a, tmp, algorithm, mode):
    """Failure-free run of a.steps steps; mode: "none", ("elastic", K) or ("disk", K). Returns ms/step."""
    ce = mode[1] if mode[0] == "elastic" else None
    cfg = os.path.join(tmp, f"cost-{algorithm}.yaml")
    with open(cfg, "w") as f:
        f.write(job_text(a, algorithm, ce, a.steps, 0, a.epochs))
    mpath = os.path.join(tmp, "cost.jsonl")
    args = ["--metrics", mpath]
    ck = os.path.join(tmp, "cost-ck")
    shutil.rmtree(ck, ignore_errors=True)
    if mode[0] == "disk":
        args += ["--checkpoint", ck, "--checkpoint-every", str(mode[1])]
    r = Run(a, f"{algorithm} {mode_name(mode)} (no failure)", cfg, args, {})
    if r.rc != 0:
        r.fail("distopt train failed")
    s = [m for m in metrics(mpath) if m.get("event") == "summary"][-1]
    shutil.rmtree(ck, ignore_errors=True)
    return {"ms_per_step": 1000.0 * s["global_batch"] / s["samples_per_s"], "samples_per_s": s["samples_per_s"],
            "steps": s["global_step"]}


def run_elastic_kill(a, tmp, algorithm, ce):
    """Kill the victim at a.kill_step in an elastic job; times from the output and the recovery event."""
    cfg = os.path.join(tmp, f"elastic-{algorithm}-{ce}.yaml")
    with open(cfg, "w") as f:
        f.write(job_text(a, algorithm, ce, a.recovery_steps, 1))
    mpath = os.path.join(tmp, "elastic.jsonl")
    r = Run(a, f"{algorithm} elastic commit_every {ce} (rank {a.victim} killed at step {a.kill_step})", cfg,
            ["--metrics", mpath],
            {"DISTOPT_FAULT_INJECT": f"exit:{a.victim}:{a.kill_step}", "DISTOPT_LOG_LEVEL": "debug"})
    if r.rc != 0:
        r.fail("the elastic job did not survive the kill")
    t_kill, _ = r.first(lambda l: f"DISTOPT_FAULT_INJECT: rank {a.victim} exits" in l, what="of the victim's exit")
    t_detect, _ = r.first(lambda l: l.startswith("[rank 0]") and "elastic: recovering" in l, t_kill,
                          "'elastic: recovering' from rank 0")
    t_agree, _ = r.first(lambda l: l.startswith("[rank 0]") and re.search(r"recovery: generation \d+ has", l),
                         t_detect, "'recovery: generation G has' from rank 0 (debug log)")
    t_rebuilt, _ = r.first(lambda l: l.startswith("[rank 0]") and "communicators and optimizer rebuilt" in l,
                           t_agree, "'communicators and optimizer rebuilt' from rank 0 (debug log)")
    t_back, _ = r.first(lambda l: l.startswith("[rank 0] elastic: generation"), t_rebuilt,
                        "'elastic: generation G: ... go on' from rank 0")
    t_step, step_line = r.first(lambda l: STEP_LINE.match(l), t_back, "of a step from rank 0 after the recovery")
    ev = [m for m in metrics(mpath) if m.get("event") == "recovery"]
    summary = [m for m in metrics(mpath) if m.get("event") == "summary"]
    if len(ev) != 1 or not summary or summary[-1]["world_size"] != a.world - 1:
        r.fail(f"expected one recovery and a summary of {a.world - 1} ranks in {mpath}")
    return {"kill_to_step_s": t_step - t_kill, "recovery_s": ev[0]["seconds"], "restored_step": ev[0]["step"],
            "steps_redone": a.kill_step - 1 - ev[0]["step"], "first_step": int(STEP_LINE.match(step_line).group(1)),
            "phases_s": {"detect": t_detect - t_kill, "agree": t_agree - t_detect, "rebuild": t_rebuilt - t_agree,
                         "restore": t_back - t_rebuilt, "step": t_step - t_back}}


def run_disk_restart(a, tmp, algorithm, k):
    """Non-elastic job with disk checkpoints every k steps, the victim killed, restarted on W-1 ranks."""
    cfg = os.path.join(tmp, f"disk-{algorithm}.yaml")
    with open(cfg, "w") as f:
        f.write(job_text(a, algorithm, None, a.recovery_steps, 1))
    ck = os.path.join(tmp, "disk-ck")
    shutil.rmtree(ck, ignore_errors=True)
    first = Run(a, f"{algorithm} disk checkpoint every {k} (rank {a.victim} killed at step {a.kill_step})", cfg,
                ["--checkpoint", ck, "--checkpoint-every", str(k)],
                {"DISTOPT_FAULT_INJECT": f"exit:{a.victim}:{a.kill_step}"})
    if first.rc == 0:
        first.fail("the non-elastic job survived the kill")
    t_kill, _ = first.first(lambda l: f"DISTOPT_FAULT_INJECT: rank {a.victim} exits" in l,
                            what="of the victim's exit")
    again = Run(a, f"{algorithm} restart on {a.world - 1} ranks from {ck}", cfg,
                ["--checkpoint", ck, "--resume", "--world-size", str(a.world - 1)], {})
    if again.rc != 0:
        again.fail("the restarted job failed")
    t_resume, resume = again.first(lambda l: l.startswith("[rank 0] resume:"), what="'resume:' from rank 0")
    m = re.search(r"\(step (\d+),", resume)
    if not m:
        again.fail(f"no step in '{resume}'")
    t_step, _ = again.first(lambda l: STEP_LINE.match(l), t_resume, "of a step from rank 0 after the resume")
    shutil.rmtree(ck, ignore_errors=True)
    restored = int(m.group(1))
    return {"kill_to_step_s": t_step - t_kill, "restored_step": restored, "steps_redone": a.kill_step - 1 - restored,
            "phases_s": {"stop": first.end - t_kill, "load": t_resume - again.start, "step": t_step - t_resume}}


def mode_name(mode):
    if mode[0] == "none":
        return "none (baseline)"
    if mode[0] == "elastic":
        return f"elastic, commit_every {mode[1]}"
    return f"disk checkpoint every {mode[1]}, restart on W-1"


def spread(values, fmt="{:.2f}", scale=1.0):
    """'median (min-max)'; a single value alone."""
    v = [x * scale for x in values]
    med = fmt.format(statistics.median(v))
    return med if len(v) == 1 or min(v) == max(v) else f"{med} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = os.environ.get("DISTOPT_BUILD_DIR", "build")
    ap.add_argument("--distopt", default=os.path.join(ROOT, build, "bin/distopt"))
    ap.add_argument("--plugin-path", action="append", default=[])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--algorithms", default="allreduce,zero", help="comma-separated: " + ", ".join(ALGORITHMS))
    ap.add_argument("--world", type=int, default=4, help="ranks at the start")
    ap.add_argument("--batch", type=int, default=96, help="per rank at the start (global batch = batch x world)")
    ap.add_argument("--steps", type=int, default=150, help="steps per epoch of the failure-free runs (cost; "
                    "Fashion-MNIST has 60000 // global batch)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the failure-free runs")
    ap.add_argument("--recovery-steps", type=int, default=40, help="steps of the runs with a kill")
    ap.add_argument("--kill-step", type=int, default=20, help="global step (1-based) at which the victim exits")
    ap.add_argument("--victim", type=int, default=2, help="the rank killed (not 0: rank 0 reports)")
    ap.add_argument("--commit-every", default="1,4", help="elastic.commit_every values, comma-separated")
    ap.add_argument("--checkpoint-every", type=int, default=4, help="disk checkpoint period of the restart row")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell, interleaved")
    ap.add_argument("--json", help="also write every run and the table's figures here")
    ap.add_argument("--verbose", action="store_true", help="echo every output line with its arrival time")
    a = ap.parse_args()
    algorithms = [x for x in a.algorithms.split(",") if x]
    commit_every = [int(x) for x in a.commit_every.split(",") if x]
    for x in algorithms:
        if x not in ALGORITHMS:
            ap.error(f"--algorithms: unknown '{x}' (known: {', '.join(ALGORITHMS)})")
    if not 0 < a.victim < a.world:
        ap.error(f"--victim {a.victim}: must be a rank other than 0 (rank 0 reports the recovery) below --world")
    if not 1 < a.kill_step <= a.recovery_steps or a.world < 2 or a.steps < 1 or a.epochs < 1 or a.checkpoint_every < 1 or \
            any(k < 1 for k in commit_every):
        ap.error("need --world >= 2, 1 < --kill-step <= --recovery-steps, --steps, --commit-every and "
                 "--checkpoint-every >= 1")
    if (a.batch * a.world) % (a.world - 1):
        print(f"note: global batch {a.batch * a.world} does not divide among {a.world - 1} ranks "
              "(unequal shares after the kill)", file=sys.stderr)
    if not a.plugin_path:
        a.plugin_path = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.distopt))), "plugins")]
    if not os.path.exists(a.distopt):
        raise SystemExit(f"no distopt executable at {a.distopt} (pass --distopt)")

    cost_modes = [("none",)] + [("elastic", k) for k in commit_every] + [("disk", a.checkpoint_every)]
    kill_modes = [("elastic", k) for k in commit_every] + [("disk", a.checkpoint_every)]
    cost = {(x, m): [] for x in algorithms for m in cost_modes}
    kill = {(x, m): [] for x in algorithms for m in kill_modes}
    loads = []
    with tempfile.TemporaryDirectory(prefix="distopt_elastic_bench_") as tmp:
        for rep in range(a.repeat):
            for x in algorithms:
                for m in cost_modes:
                    loads.append(os.getloadavg()[0])
                    r = run_cost(a, tmp, x, m)
                    cost[(x, m)].append(r)
                    print(f"run {rep + 1}/{a.repeat} {x} {mode_name(m)}, no failure: {r['ms_per_step']:.2f} ms/step "
                          f"(load {loads[-1]:.2f})", file=sys.stderr, flush=True)
                for m in kill_modes:
                    loads.append(os.getloadavg()[0])
                    r = run_elastic_kill(a, tmp, x, m[1]) if m[0] == "elastic" else run_disk_restart(a, tmp, x, m[1])
                    kill[(x, m)].append(r)
                    print(f"run {rep + 1}/{a.repeat} {x} {mode_name(m)}, rank {a.victim} killed at step "
                          f"{a.kill_step}: {r['kill_to_step_s']:.2f} s to the next step, {r['steps_redone']} step(s) "
                          f"redone, phases " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items()) +
                          f" (load {loads[-1]:.2f})", file=sys.stderr, flush=True)

    cost_steps = sorted({r["steps"] for rs in cost.values() for r in rs})
    cost_steps = "/".join(str(n) for n in cost_steps)
    print(f"mlp, {a.world} ranks x 1 thread on {os.cpu_count()} cores (loopback, tcp), batch {a.batch}/rank "
          f"(global {a.batch * a.world}, kept on {a.world - 1}), adam; rank {a.victim} killed at global step "
          f"{a.kill_step} of {a.recovery_steps}; failure-free runs {cost_steps} steps; {a.repeat} run(s) per cell; "
          f"1-min load average {min(loads):.2f}-{max(loads):.2f}\n")
    print("| algorithm | fault tolerance | kill -> next step, s | phases, s | recovery (printed), s | steps redone "
          "| ms/step, no failure | cost |")
    print("|---|---|---|---|---|---|---|---|")
    table = []
    for x in algorithms:
        base = [r["ms_per_step"] for r in cost[(x, ("none",))]]
        for m in cost_modes:
            ms = [r["ms_per_step"] for r in cost[(x, m)]]
            row = {"algorithm": x, "mode": mode_name(m), "ms_per_step": ms}
            cells = ["", "", "", ""]
            if m[0] != "none":
                row["cost"] = [v / b - 1 for v, b in zip(ms, base)]
                rs = kill[(x, m)]
                row["kill_to_step_s"] = [r["kill_to_step_s"] for r in rs]
                row["steps_redone"] = [r["steps_redone"] for r in rs]
                row["phases_s"] = {k: [r["phases_s"][k] for r in rs] for k in rs[0]["phases_s"]}
                cells[0] = spread(row["kill_to_step_s"])
                cells[1] = " / ".join(f"{k} {statistics.median(v):.2f}" for k, v in row["phases_s"].items())
                if m[0] == "elastic":
                    row["recovery_s"] = [r["recovery_s"] for r in rs]
                    cells[2] = spread(row["recovery_s"])
                cells[3] = spread(row["steps_redone"], "{:.0f}")
            cost_cell = "(baseline)"
            if "cost" in row:
                row["extra_ms_per_step"] = [v - b for v, b in zip(ms, base)]
                # The fastest runs: the least disturbed by the machine's other load.
                row["cost_fastest"] = min(ms) / min(base) - 1
                cost_cell = (spread(row["cost"], "{:+.1f}%", 100) + ", " +
                             spread(row["extra_ms_per_step"], "{:+.2f}") + f" ms; fastest {100 * row['cost_fastest']:+.1f}%")
            print(f"| {x} | {mode_name(m)} | {' | '.join(cells)} | {spread(ms)} | {cost_cell} |")
            table.append(row)
    print(f"\nkill -> next step: from the victim's last line to rank 0's first step line after it (arrival times); "
          f"phases: see --help. The targets: recovery under 2 s on loopback; commit cost under 5% "
          f"(allreduce) and 15% (zero) of the step.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "loads": loads, "rows": table,
                       "runs": {"cost": {f"{x} {mode_name(m)}": v for (x, m), v in cost.items()},
                                "kill": {f"{x} {mode_name(m)}": v for (x, m), v in kill.items()}}}, f, indent=1)


if __name__ == "__main__":
    main()
